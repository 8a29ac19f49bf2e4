"""`lockstep check -j N` and `regen -j N`: the planned rows run in N worker processes, reported as one serial run.

Each row (spec, RunContext, golden folder) is checked by `runner.check_spec` exactly as the serial
loop does; only where it runs changes. Outcomes come back in the rows' order whatever order the
workers finish in, so the table, the report, the JSON document and the exit code are the ones a
serial run gives (the seconds aside). Workers are fresh "spawn" processes (no state forked from a
half-initialised torch) with one torch thread each: N workers already fill N cores, and the bits
do not depend on the thread count (DESIGN D0), and each keeps freed memory for its next
temporaries (harness/memory.py; the serial path too). A spec that starts ranks of its own (topologies)
can: pool workers are not daemons. The workers share one folder of synthetic checkpoints for the
run (harness/checkpoints.py, $LOCKSTEP_CHECKPOINT_CACHE), so each is made once, not once per worker.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor

from lockstep.harness import runner, suite
from lockstep.harness.golden import GoldenStore
from lockstep.harness.memory import keep_freed_memory


def default_jobs() -> int:
    """$LOCKSTEP_JOBS when set (the test suite sets 1: its xdist workers already fill the cores),
    else the cores this process may run on (its affinity mask, not the machine's count)."""
    if os.environ.get("LOCKSTEP_JOBS", "").isdigit() and int(os.environ["LOCKSTEP_JOBS"]) >= 1:
        return int(os.environ["LOCKSTEP_JOBS"])
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:                    # macOS, Windows: no affinity masks
        return max(1, os.cpu_count() or 1)


def check_rows(rows: list[tuple], store: GoldenStore, strict: bool, jobs: int | None,
               waiting: Callable[[int, str], None] | None = None) -> Iterator[runner.Outcome]:
    """Yield each row's Outcome in the rows' order, from `jobs` processes (None: default_jobs());
    `waiting(i, spec id)` (1-based) is called before the i-th is awaited (the live progress line)."""
    yield from _run_rows(rows, functools.partial(runner.check_spec, store=store, strict=strict), jobs, waiting,
                         _dead_check)


def regen_rows(rows: list[tuple], store: GoldenStore, write: bool, jobs: int | None,
               waiting: Callable[[int, str], None] | None = None) -> Iterator[runner.RegenOutcome]:
    """`lockstep regen -j N`: each row's RegenOutcome in the rows' order, as check_rows. The workers
    write distinct goldens; the parent holds the golden folder's writer lock for all of them."""
    yield from _run_rows(rows, functools.partial(runner.regen_spec, store=store, write=write), jobs, waiting,
                         _dead_regen)


def _run_rows(rows, call, jobs, waiting, dead) -> Iterator:
    """call(spec, ctx) for each row, serially or in a pool of spawned workers; `dead(spec, folder,
    error)` is the outcome of a row whose worker died."""
    from lockstep.engine.world import joined
    jobs = 1 if joined() else min(jobs or default_jobs(), len(rows))     # torchrun's ranks serve this process
    keep_freed_memory()                       # this process's rows (serial), and the workers' parent
    if jobs <= 1:
        for i, (spec, ctx, _) in enumerate(rows, 1):
            if waiting:
                waiting(i, spec.id)
            yield call(spec, ctx)
        return
    from lockstep.harness.checkpoints import SHARED_ENV

    shared = os.environ.get(SHARED_ENV) or tempfile.mkdtemp(prefix="lockstep-shared-checkpoints-")
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_start_worker, initargs=(suite.explicit_mappings(), shared))
    try:
        futures = [pool.submit(call, spec, ctx) for spec, ctx, _ in rows]
        for i, ((spec, ctx, folder), future) in enumerate(zip(rows, futures), 1):
            if waiting:
                waiting(i, spec.id)
            try:
                yield future.result()
            except Exception as e:  # noqa: BLE001 - BrokenProcessPool, or an outcome that cannot be sent back
                yield dead(spec, folder, e)
    finally:                                  # an interrupted run leaves no worker behind
        pool.shutdown(wait=True, cancel_futures=True)
        if shared != os.environ.get(SHARED_ENV):
            shutil.rmtree(shared, ignore_errors=True)


def _start_worker(mapped: dict, shared_checkpoints: str) -> None:
    """A worker starts as the parent was set up: its --checkpoint-path mappings, one torch thread;
    and it shares the run's synthetic checkpoints with the other workers."""
    import torch

    from lockstep.harness.checkpoints import SHARED_ENV

    os.environ[SHARED_ENV] = shared_checkpoints

    torch.set_num_threads(1)
    keep_freed_memory()
    suite.map_checkpoints(mapped.items())


def _dead_check(spec, folder: str, e: Exception) -> runner.Outcome:
    """A worker that died (a segfault, the OOM killer) is this row's CRASH, since a serial run would
    have died there too."""
    return runner.Outcome(spec, runner.CRASH, folder, messages=[
        f"crashed: the worker process checking it failed: {type(e).__name__}: {e} "
        f"(run `lockstep check {spec.id} -j 1` to see it in this process)"])


def _dead_regen(spec, folder: str, e: Exception) -> runner.RegenOutcome:
    return runner.RegenOutcome(spec, runner.REFUSED, folder, explanation=[
        f"the worker process recording it failed: {type(e).__name__}: {e} (run `lockstep regen {spec.id} -j 1` "
        "to see it in this process)"])
