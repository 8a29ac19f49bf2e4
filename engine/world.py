"""Ranks started by torchrun (torch.distributed.run: one node, or many with a rendezvous endpoint).

    torchrun --standalone --nproc-per-node 2 -m lockstep check 'topology/*'

Every process torchrun starts runs the same command. `join()` makes each a rank of torchrun's world
(gloo, from torchrun's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Rank 0 runs the command and
reports; every other rank `serve()`s: it waits for rank 0's tasks, each one function of
engine.parallel's ranks (the entry point Lockstep's own launcher starts too, `parallel._on_rank`),
runs its part and sends its result back, until rank 0 `finish()`es. A topology runs on the whole
world: one of another size is refused (`world_problem`; the harness lists it as not run), one of
size 1 runs on rank 0 alone. The collectives and their order are the launcher's, so the bits are
the same. Checkpoint paths are rank 0's: on several nodes they must be on a shared filesystem.
"""

from __future__ import annotations

import os
import traceback
from datetime import timedelta

# What torchrun (torch.distributed.elastic) sets in every process it starts.
TORCHRUN_ENV = ("TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
TIMEOUT_ENV = "LOCKSTEP_COLLECTIVE_TIMEOUT"       # seconds a collective of the world may wait (default 300)

_joined: dict = {}


def started_by_torchrun() -> bool:
    """Whether torchrun started this process (and not Lockstep's launcher, whose ranks it may start)."""
    return all(k in os.environ for k in TORCHRUN_ENV) and "LOCKSTEP_TRANSPORT" not in os.environ


def join() -> tuple[int, int]:
    """Make this process a rank of torchrun's world (once) -> (rank, world size)."""
    import torch.distributed as dist
    if not _joined:
        timeout = timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "300")))
        dist.init_process_group("gloo", init_method="env://", timeout=timeout)
        _joined.update(rank=dist.get_rank(), size=dist.get_world_size())
    return _joined["rank"], _joined["size"]


def joined() -> int:
    """The world's size when this process joined torchrun's world, else 0."""
    return _joined.get("size", 0)


def world_problem(world_size: int) -> str | None:
    """Why a topology of `world_size` ranks cannot run in this world, or None."""
    size = joined()
    if not size or world_size in (1, size):
        return None
    return f"needs {world_size} ranks, torchrun's world has {size} (run it with --nproc-per-node x --nnodes = {world_size})"


def _task(fn, args: tuple, device: str):
    """fn(*args) on this rank with the device and transport a rank of `device` uses here: the CPU
    over gloo, or this node's GPU LOCAL_RANK mod G over gloo through host copies."""
    from lockstep.engine.launch import plan
    saved = {k: os.environ.get(k) for k in ("LOCKSTEP_DEVICE", "LOCKSTEP_TRANSPORT")}
    if device == "cuda":
        import torch
        local = int(os.environ.get("LOCAL_RANK", "0"))
        _, devices = plan("cuda", local + 1, torch.cuda.device_count(), "gloo-host")
        os.environ.update(LOCKSTEP_DEVICE=devices[local], LOCKSTEP_TRANSPORT="gloo-host")
    try:
        return fn(*args)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(fn, args: tuple, device: str) -> list:
    """On rank 0: fn(*args) on every rank of the world -> each rank's result, in rank order.
    RuntimeError naming the ranks that raised (with their last traceback lines)."""
    import torch.distributed as dist
    dist.broadcast_object_list([(fn, args, device)], src=0)
    outcomes = [None] * joined()
    dist.gather_object(_outcome(fn, args, device), outcomes, dst=0)
    failed = {r: o[1] for r, o in enumerate(outcomes) if o[0] != "ok"}
    if failed:
        lines = [f"rank {r} raised {tb.strip().splitlines()[-1]}" for r, tb in failed.items()]
        raise RuntimeError(f"torchrun world of {joined()} ranks failed: " + "; ".join(lines) + "\n"
                           + "\n".join(failed[min(failed)].strip().splitlines()[-6:]))
    return [o[1] for o in outcomes]


def _outcome(fn, args: tuple, device: str) -> tuple[str, object]:
    try:
        return "ok", _task(fn, args, device)
    except BaseException:   # noqa: BLE001 - a rank's failure goes to rank 0, which names it
        return "error", traceback.format_exc()


def serve() -> int:
    """On every rank but 0: run rank 0's tasks until it finishes -> exit code 0."""
    import torch.distributed as dist
    while True:
        task = [None]
        dist.broadcast_object_list(task, src=0)
        if task[0] is None:
            break
        dist.gather_object(_outcome(*task[0]), None, dst=0)
    dist.destroy_process_group()
    return 0


def finish() -> None:
    """On rank 0: tell the serving ranks to stop, and leave the world."""
    import torch.distributed as dist
    dist.broadcast_object_list([None], src=0)
    dist.destroy_process_group()
    _joined.clear()
