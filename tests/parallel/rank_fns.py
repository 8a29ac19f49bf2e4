"""Functions the launcher tests run on every rank (launched rank processes import them by name)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def gather_ranks(tag: str) -> dict:
    """Every rank's number, all-gathered on the device the group's backend moves (NCCL: the GPU)."""
    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([dist.get_rank()], device=device)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return {"tag": tag, "rank": dist.get_rank(), "world": dist.get_world_size(),
            "env": (os.environ["MASTER_ADDR"], os.environ["RANK"]), "all": torch.cat(out).cpu().tolist()}


def one_raises_one_hangs() -> dict:
    """Rank 1 raises before the collective, rank 2 never reaches it. A barrier first: every rank
    has joined the group before rank 1 exits (else a rank still connecting, as a slower CUDA rank
    may be, fails with a connection error to rank 1 instead of reaching its hang)."""
    dist.barrier()
    if dist.get_rank() == 1:
        raise ValueError("rank 1 fails on purpose")
    if dist.get_rank() == 2:
        time.sleep(10 ** 6)
    return gather_ranks("unreachable")


def one_hangs() -> dict:
    if dist.get_rank() == 1:
        time.sleep(10 ** 6)
    return gather_ranks("unreachable")


def one_dies() -> dict:
    if dist.get_rank() == 1:
        os._exit(7)                                     # no traceback, no result
    return gather_ranks("unreachable")


def placement() -> tuple:
    """(this rank's device, transport, whether its collectives go through host copies)."""
    from lockstep.engine.distributed import ParallelContext, Topology
    ctx = ParallelContext(Topology(dist.get_world_size(), 1))
    return str(ctx.device), ctx.transport, ctx.host_copies


def environment_and_patch(name: str) -> tuple:
    """(this rank's value of environment variable `name`, engine.launch's first collective marker:
    a monkeypatch of it in the launching process must not reach here)."""
    from lockstep.engine import launch
    return os.environ.get(name), launch._COLLECTIVE_MARKERS[0]
