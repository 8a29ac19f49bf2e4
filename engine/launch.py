"""Run a function on every rank of a local process group, and get each rank's result back.

    results = launch(fn, world_size=4, args=(ckpt_dir,), timeout_s=300)
    # results[r] is what fn(*args, **kwargs) returned on rank r

Each rank is a new process that finds `fn` by importing it (`fn` must be importable by module
and name, and its arguments and result picklable), started by `_rank_context`: forked from
multiprocessing's fork server, which has imported torch once, or spawned afresh where the platform
has no fork server. Either way a rank never inherits the launching process's memory (a monkeypatch
there is not seen), and it takes the launching process's environment as it is at the call.
Before `fn` runs, torch.distributed is
initialised through the launching process's TCPStore on 127.0.0.1 (MASTER_ADDR, MASTER_PORT), with
RANK, WORLD_SIZE and LOCAL_RANK set,
and `collective_timeout_s` as the process group's timeout, so a collective waiting for a dead or
stuck peer fails instead of hanging (see process_group_options).

Where the ranks run and how they talk (`plan`, a pure function of the device and GPU count):

    device "cpu"                      transport "gloo"        every rank on the CPU
    device "cuda", a GPU per rank     transport "nccl"        rank r on GPU r (the group's device_id)
    device "cuda", fewer GPUs         transport "gloo-host"   rank r on GPU r mod G; gloo moves host
                                                              copies of the CUDA tensors (NCCL
                                                              refuses two ranks on one GPU)

Each rank finds its device and transport in LOCKSTEP_DEVICE and LOCKSTEP_TRANSPORT
(engine.distributed.ParallelContext reads them). The transport only moves bytes, so the bits
are the same whichever is chosen.

A run never hangs and never fails silently: RankFailure is raised, naming the ranks, when

  - a rank raises (its traceback is in the message),
  - a rank dies without a result (exit code or signal),
  - a rank is still running `grace_s` after another rank failed (it hung; it is killed;
    grace_s defaults to the collective timeout + 2 s, so peers blocked in a collective
    report their timeout first and only the stuck rank is named as hung), or
  - the whole run passes `timeout_s` (the ranks still running are named and killed).

Results travel through files (torch.save) in a private temporary directory, not through
shared memory, so a rank may exit as soon as it has written its result.
"""

from __future__ import annotations

import inspect
import os
import shutil
import signal
import tempfile
import time
import traceback
from datetime import timedelta
from multiprocessing import util
from pathlib import Path
from typing import Any, Callable

import torch
import torch.multiprocessing as mp

from lockstep.engine import lifeline

_LAUNCHER = "_LOCKSTEP_LAUNCHER_PID"     # passed to a rank beside the environment, never set in it
# Words that mark a rank's error as a consequence (a collective lost its peer), not a cause.
_COLLECTIVE_MARKERS = ("timed out", "timeout", "connection closed", "connection reset", "broken pipe",
                       "gloo", "nccl", "distbackenderror", "connection refused", "peer")


class RankFailure(RuntimeError):
    """A launched run failed; `.ranks` maps each rank to what happened to it."""

    def __init__(self, message: str, ranks: dict[int, str]):
        super().__init__(message)
        self.ranks = ranks


TRANSPORTS = ("gloo", "nccl", "gloo-host")


def plan(device: str, world_size: int, gpus: int, transport: str | None = None) -> tuple[str, list[str]]:
    """(transport, the device of each rank) for `world_size` ranks on `device` ("cpu" or "cuda")
    with `gpus` GPUs here: rank r on GPU r mod gpus; NCCL when every rank has its own GPU, else
    gloo over host copies. `transport` forces one ("gloo-host" on the CPU stages through fresh
    host buffers all the same: how the tests exercise that path without a GPU)."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"launch: device must be 'cpu' or 'cuda', got {device!r}")
    if transport is not None and transport not in TRANSPORTS:
        raise ValueError(f"launch: transport must be one of {TRANSPORTS}, got {transport!r}")
    if device == "cpu":
        if transport == "nccl":
            raise ValueError("launch: the nccl transport needs device 'cuda'")
        return transport or "gloo", ["cpu"] * world_size
    if gpus < 1:
        raise ValueError("launch: device 'cuda' asked for, but this machine has no CUDA GPU")
    if transport == "nccl" and gpus < world_size:
        raise ValueError(f"launch: nccl needs a GPU per rank ({world_size}), this machine has {gpus}; "
                         f"ranks sharing a GPU use gloo-host")
    chosen = transport or ("nccl" if gpus >= world_size else "gloo-host")
    return chosen, [f"cuda:{r % gpus}" for r in range(world_size)]


def _rank_context():
    """How ranks start. multiprocessing's fork server is one process per launching process, started
    at the first launch, that imports torch (and torch.distributed) and forks a rank per request: a
    rank then skips torch's import, ~2 CPU s a rank. Where
    CUDA is not available it imports the engine too (engine.parallel: the kernels, the model,
    ~0.3 CPU s a rank; tens of ranks in a check of the topology specs): on a CUDA machine that
    import would ask the driver for its devices, and a rank forked after that cannot use CUDA, so
    there a rank imports the engine itself. The server runs no tensor op and never touches CUDA (a
    forked rank initialises its own, as a spawned one did); its threads besides the main one
    (numpy's BLAS pool) are idle, and a fork copies only the forking thread. A rank imports
    everything else (`fn`'s module) itself. Where there is no fork server: "spawn"."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    _short_socket_dir()
    ctx = mp.get_context("forkserver")
    preload = ["torch", "torch.distributed"] + ([] if torch.cuda.is_available() else ["lockstep.engine.parallel"])
    ctx.set_forkserver_preload(preload)                              # used when the server starts
    return ctx


# AF_UNIX socket paths hold 107 bytes; the fork server listens at <temp dir>/pymp-XXXXXXXX/listener-XXXXXXXX
# (about 40 bytes below the temp dir), so a temp dir longer than this cannot hold it.
SOCKET_DIR_ROOM = 64


def _short_socket_dir() -> None:
    """Where $TMPDIR is too long for the fork server's socket, multiprocessing's own temp folder
    (made once a process, holding the socket) goes under a short system one instead: the run
    works whatever $TMPDIR is. Nothing else moves."""
    if len(tempfile.gettempdir()) <= SOCKET_DIR_ROOM:
        return
    short = next((d for d in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(d) and os.access(d, os.W_OK)), None)
    if short is None:
        return
    saved, tempfile.tempdir = tempfile.tempdir, short
    try:
        util.get_temp_dir()           # made now, under `short`, and kept for this process
    finally:
        tempfile.tempdir = saved


def _rank_main(rank: int, world_size: int, port: int, transport: str, rank_device: str, collective_timeout_s: float,
               threads: int | None, fn: Callable, args: tuple, kwargs: dict, out_dir: str, env: dict) -> None:
    out = Path(out_dir)
    # no rank outlives the process that launched it (a killed check), nor the fork server between
    lifeline.kill_on_parent_death()
    lifeline.watch_parent(os.getppid(), launcher=int(env.pop(_LAUNCHER, "0")) or None)
    # the launching process's environment at the call (a forked rank starts with the server's, that
    # of the first launch), before anything reads it: the kernels, CUDA, gloo
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCKSTEP_DEVICE=rank_device, LOCKSTEP_TRANSPORT=transport)
    try:
        if threads:
            torch.set_num_threads(threads)
        import torch.distributed as dist
        group = "nccl" if transport == "nccl" else "gloo"           # gloo-host: gloo between host copies
        if rank_device != "cpu":
            torch.cuda.set_device(torch.device(rank_device))
        gpu = torch.device(rank_device).index if rank_device != "cpu" else rank
        timeout = timedelta(seconds=collective_timeout_s)
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timeout,
                              wait_for_workers=False)      # the launcher's: listening before any rank starts
        dist.init_process_group(group, store=store, rank=rank, world_size=world_size, timeout=timeout,
                                **process_group_options(group, gpu))
        result = fn(*args, **kwargs)
        dist.barrier()                  # every rank is past its last collective before any tears down
        tmp = out / f"rank{rank}.pt.tmp"
        torch.save(result, tmp)
        os.replace(tmp, out / f"rank{rank}.pt")
        dist.destroy_process_group()
    except BaseException:   # noqa: BLE001 - everything a rank can raise goes to the parent
        (out / f"rank{rank}.err").write_text(traceback.format_exc())
        os._exit(1)         # no atexit / gloo teardown that could block on a lost peer


def process_group_options(group: str, local_rank: int) -> dict:
    """What init_process_group needs beyond the basics, per process-group kind ("gloo" or "nccl").

    NCCL: this rank's GPU as `device_id` (and the current device), so the group knows its device
    up front: barrier() then neither guesses a GPU nor warns about it on every call, and NCCL's
    communicators start eagerly. TORCH_NCCL_BLOCKING_WAIT=1 (unless set already) makes a
    collective whose peer died or hangs raise in Python after the collective timeout, as gloo
    does, instead of the watchdog killing the process: the rank then reports a timeout
    (a consequence) and the launcher names the peer that caused it. Gloo needs nothing."""
    if group != "nccl":
        return {}
    os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    import torch.distributed as dist
    return {"device_id": device} if "device_id" in inspect.signature(dist.init_process_group).parameters else {}


def _kill(procs) -> None:
    started = [p for p in procs if p.pid is not None]
    for p in started:
        if p.is_alive():
            p.kill()
    for p in started:
        p.join(timeout=5)


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "(empty traceback)"


def _gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def launch(fn: Callable, world_size: int, args: tuple = (), kwargs: dict | None = None, *,
           device: str | None = None, transport: str | None = None,
           timeout_s: float = 600.0, collective_timeout_s: float = 60.0,
           grace_s: float | None = None, threads: int | None = 1) -> list[Any]:
    """fn(*args, **kwargs) on ranks 0 … world_size-1 -> [result of rank 0, rank 1, ...].
    `device`: "cpu" or "cuda" (default: cuda if CUDA has a device per rank, else cpu); the
    transport follows (`plan`; `transport` forces one: gloo, gloo-host or nccl).
    `threads`: torch threads per rank (None leaves torch's default).
    `grace_s` (default collective_timeout_s + 2): how long the other ranks may still report
    after the first failure; a peer blocked in a collective fails within its timeout, so a
    rank still running after that is reported as hung."""
    if grace_s is None:
        grace_s = collective_timeout_s + 2.0
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"launch: world_size must be a positive int, got {world_size!r}")
    if device is None:
        device = "cuda" if transport == "nccl" or (transport is None and _gpu_count() >= world_size) else "cpu"
    transport, rank_devices = plan(device, world_size, _gpu_count() if device == "cuda" else 0, transport)
    kwargs = kwargs or {}
    out_dir = lifeline.run_folder("lockstep-launch")
    ctx = _rank_context()
    store = _rendezvous_store(world_size, collective_timeout_s)
    port = store.port
    procs = [ctx.Process(target=_rank_main, name=f"lockstep-rank{r}", daemon=True,
                         args=(r, world_size, port, transport, rank_devices[r], collective_timeout_s, threads, fn, args,
                               kwargs, out_dir, _caller_environment()))
             for r in range(world_size)]
    out = Path(out_dir)
    try:
        for p in procs:
            p.start()
        start, first_failure = time.monotonic(), None
        while True:
            state = {}
            for r, p in enumerate(procs):
                if (out / f"rank{r}.err").exists():
                    state[r] = "error"
                elif p.exitcode is None:
                    state[r] = "running"
                elif p.exitcode == 0 and (out / f"rank{r}.pt").exists():
                    state[r] = "done"
                else:
                    p.join(timeout=1)
                    state[r] = "error" if (out / f"rank{r}.err").exists() else "died"
            if all(s == "done" for s in state.values()):
                return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
            now = time.monotonic()
            failed = any(s in ("error", "died") for s in state.values())
            if failed and first_failure is None:
                first_failure = now
            if failed and (all(s != "running" for s in state.values()) or now - first_failure > grace_s):
                _kill(procs)
                raise _failure(world_size, state, procs, out, "after a rank failed")
            if now - start > timeout_s:
                _kill(procs)
                raise _failure(world_size, state, procs, out, f"the run passed timeout_s={timeout_s:g}")
            time.sleep(0.05)
    finally:
        _kill(procs)
        del store                       # its server thread stops once every rank is gone
        shutil.rmtree(out_dir, ignore_errors=True)


def _rendezvous_store(world_size: int, timeout_s: float):
    """The run's TCPStore server, held by the launching process on a port of its choosing, so it is
    listening before any rank starts: a rank that reached its rendezvous before rank 0 had opened the
    store used to have its connection refused and back off ~0.45 s (half the launches of a topology
    spec, docs/gate.md), and a port found free beforehand could be taken in between."""
    import torch.distributed as dist
    return dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def _failure(world_size: int, state: dict[int, str], procs, out: Path, why: str) -> RankFailure:
    detail, causes, consequences = {}, [], []
    for r in range(world_size):
        s = state[r]
        if s == "error":
            tb = (out / f"rank{r}.err").read_text()
            last = _last_line(tb)
            detail[r] = f"raised {last}"
            (consequences if any(m in last.lower() for m in _COLLECTIVE_MARKERS) else causes).append(r)
            detail[r] += "\n" + "\n".join("      " + ln for ln in tb.strip().splitlines()[-4:])
        elif s == "died":
            code = procs[r].exitcode
            how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
            detail[r] = f"died without a result ({how})"
            causes.append(r)
        elif s == "running":
            detail[r] = "hung: still running, no result; killed"
            causes.append(r)
        else:
            detail[r] = "finished"
    if not causes:                      # only collective errors: report them as the cause
        causes = consequences
    head = ", ".join(f"rank {r} {detail[r].splitlines()[0]}" for r in causes)
    lines = [f"launch(world_size={world_size}) failed ({why}): {head}"]
    lines += [f"  rank {r}: {detail[r]}" for r in range(world_size)]
    return RankFailure("\n".join(lines), {r: detail[r].splitlines()[0] for r in range(world_size)})


def _caller_environment() -> dict:
    """The launching process's environment as it is at the call (a rank takes it, never the fork
    server's of when it started), marked with the launcher's pid (the ranks' lifeline)."""
    env = dict(os.environ)
    env[_LAUNCHER] = str(os.getpid())
    return env
