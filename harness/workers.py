"""`lockstep check -j N` and `regen -j N` (and `check --target`, `report`, `expectations` with -j N
on another engine): the planned rows run in N worker processes, reported as one serial run.

Each row (spec, RunContext, golden folder) is checked by `runner.check_spec` exactly as the serial
loop does; only where it runs changes. Outcomes come back in the rows' order whatever order the
workers finish in, so the table, the report, the JSON document and the exit code are the ones a
serial run gives (the seconds and the process count aside). Workers are fresh "spawn" processes (no state forked from a
half-initialised torch) with one torch thread each: N workers already fill N cores, and the bits
do not depend on the thread count (DESIGN D0), and each keeps freed memory for its next
temporaries (harness/memory.py; the serial path too). A spec that starts ranks of its own (topologies)
can: workers are not daemons. The workers share one folder of synthetic checkpoints for the
run (harness/checkpoints.py, $LOCKSTEP_CHECKPOINT_CACHE), so each is made once, not once per worker.
Each worker takes one row at a time, so a worker that dies costs that row alone (its CRASH; a new
worker takes the next), and each ends with its parent however the parent ends (engine/lifeline.py),
removing the run's folders on its way out; a later run removes any a SIGKILL left.
Another engine's target object lives in the parent: each worker builds it again by its registry
name at the parent's dtype policy (harness/targets: `recipe`, `rebuild`), once per worker.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import shutil
import signal
import sys
from collections.abc import Callable, Iterator
from multiprocessing.connection import wait

import torch

from lockstep.engine import lifeline
from lockstep.engine.world import joined
from lockstep.harness import runner, suite_paths
from lockstep.harness.checkpoints import SHARED_ENV
from lockstep.harness.errors import UsageError
from lockstep.harness.golden import GoldenStore
from lockstep.harness.memory import keep_freed_memory
from lockstep.harness.targets import rebuild
from lockstep.harness.targets.judge import FAIL, TargetOutcome, run_on_target

JOBS_ENV = "LOCKSTEP_JOBS"


def cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:                    # macOS, Windows: no affinity masks
        return max(1, os.cpu_count() or 1)


def default_jobs() -> int:
    """$LOCKSTEP_JOBS when set (the test suite sets 1: its xdist workers already fill the cores),
    read as -j is (a whole number >= 1, else a usage error), else the cores available."""
    text = os.environ.get(JOBS_ENV)
    if text is None or text.strip() == "":
        return cores()
    try:
        jobs = int(text)
    except ValueError:
        raise UsageError(f"${JOBS_ENV}={text!r}: expected a whole number, as -j takes") from None
    if jobs < 1:
        raise UsageError(f"${JOBS_ENV}={text!r}: must be at least 1, as -j")
    return jobs


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


def target_rows(rows: list[tuple], recipe: tuple[str, str], label: str, store: GoldenStore, jobs: int | None,
                waiting: Callable[[int, str], None] | None = None) -> Iterator:
    """Each row's TargetOutcome on the target that `recipe` (registry name, dtype policy) rebuilds,
    labelled `label` in the parent, in the rows' order, as check_rows."""
    call = functools.partial(_on_target, recipe=recipe, label=label, store=store)
    yield from _run_rows(rows, call, jobs, waiting, functools.partial(_dead_target, label))


def processes(jobs: int | None, rows: int) -> int:
    """The processes `rows` rows run in at -j `jobs`: 1 under torchrun (its ranks serve this process)."""
    return 1 if joined() else max(1, min(jobs or default_jobs(), rows))


def _run_rows(rows, call, jobs, waiting, dead) -> Iterator:
    """call(spec, ctx) for each row, serially or in a pool of spawned workers; `dead(spec, folder,
    error)` is the outcome of a row whose worker died."""
    jobs = processes(jobs, len(rows)) if rows else 1
    keep_freed_memory()                       # this process's rows (serial), and the workers' parent
    if jobs <= 1:
        for i, (spec, ctx, _) in enumerate(rows, 1):
            if waiting:
                waiting(i, spec.id)
            yield call(spec, ctx)
        return
    if jobs > cores():
        print(f"note: -j {jobs} is more than the {cores()} cores available: {jobs} worker processes "
              f"(each its own torch, a few hundred MB) take turns on them", file=sys.stderr)

    lifeline.sweep()                          # the folders of runs that were killed
    shared = os.environ.get(SHARED_ENV) or lifeline.run_folder("lockstep-shared-checkpoints")
    pool = _Pool(jobs, (suite_paths.explicit_mappings(), shared))
    try:
        pool.start([(call, (spec, ctx)) for spec, ctx, _ in rows])
        for i, (spec, ctx, folder) in enumerate(rows, 1):
            if waiting:
                waiting(i, spec.id)
            ok, value = pool.result(i - 1)
            yield value if ok else dead(spec, folder, value)
    finally:                                  # an interrupted run leaves no worker behind
        pool.close()
        if shared != os.environ.get(SHARED_ENV):
            shutil.rmtree(shared, ignore_errors=True)


class _Pool:
    """`jobs` spawned workers, each given one task at a time over its own pipe: a worker that dies
    loses only the task it held, and a new worker takes its place for the rest."""

    def __init__(self, jobs: int, initargs: tuple):
        self.ctx = multiprocessing.get_context("spawn")
        self.jobs, self.initargs = jobs, initargs
        self.workers: list[_Worker] = []
        self.tasks: list = []
        self.next = 0
        self.done: dict[int, tuple[bool, object]] = {}

    def start(self, tasks: list) -> None:
        self.tasks = tasks
        while len(self.workers) < min(self.jobs, len(tasks)):
            self.workers.append(_Worker(self.ctx, self.initargs))
        for w in self.workers:
            self._feed(w)

    def result(self, index: int) -> tuple[bool, object]:
        """Task `index`'s (ok, value or the reason it has none), waiting as long as it takes."""
        while index not in self.done:
            self._pump()
        return self.done.pop(index)

    def _feed(self, w: _Worker) -> None:
        if self.next < len(self.tasks):
            w.give(self.next, self.tasks[self.next])
            self.next += 1

    def _pump(self) -> None:
        busy = [w for w in self.workers if w.task is not None]
        ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy])
        for w in busy:
            if w.conn in ready or w.proc.sentinel in ready:
                index, ok, value = w.take()
                self.done[index] = (ok, value)
                if not w.proc.is_alive() and self.next < len(self.tasks):   # a new one takes its place
                    self.workers[self.workers.index(w)] = w = _Worker(self.ctx, self.initargs)
                self._feed(w)

    def close(self) -> None:
        for w in self.workers:
            w.stop()
        for w in self.workers:
            w.proc.join(timeout=5)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(timeout=5)


class _Worker:
    def __init__(self, ctx, initargs: tuple):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, os.getpid(), initargs), name="lockstep-check-worker")
        self.proc.start()
        child.close()
        self.task: int | None = None

    def give(self, index: int, task) -> None:
        self.task = index
        try:
            self.conn.send(task)
        except (OSError, ValueError):          # a dead worker: take() reports it
            pass

    def take(self) -> tuple[int, bool, object]:
        index, self.task = self.task, None
        try:
            ok, value = self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(timeout=5)
            code = self.proc.exitcode
            return index, False, f"the worker process checking it died ({_how(code)})"
        return index, ok, value

    def stop(self) -> None:
        if self.task is not None:              # interrupted mid-row: nothing to wait for
            self.proc.kill()
            return
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass


def _how(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def _worker_main(conn, parent: int, initargs: tuple) -> None:
    """One worker: set up as the parent was, then run tasks one at a time until told to stop."""
    lifeline.watch_parent(parent, on_death=lambda: _leave(parent))
    _start_worker(*initargs)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        fn, args = task
        try:
            value = (True, fn(*args))
            conn.send(value)
        except Exception as e:  # noqa: BLE001 - an Outcome that cannot be sent back, a runner bug
            conn.send((False, f"{type(e).__name__}: {e}"))


def _leave(parent: int) -> None:
    """The parent is gone: remove its run folders (the shared checkpoints; never a folder the user
    named in $LOCKSTEP_CHECKPOINT_CACHE) and this worker's own, and end this worker's children."""
    lifeline.remove_own_folders(parent)
    lifeline.remove_own_folders()
    mp_temp = multiprocessing.current_process()._config.get("tempdir")   # the fork server's socket
    if mp_temp:
        shutil.rmtree(mp_temp, ignore_errors=True)
    for child in multiprocessing.active_children():
        child.kill()


def _start_worker(mapped: dict, shared_checkpoints: str) -> None:
    """A worker starts as the parent was set up: its --checkpoint-path mappings, one torch thread;
    and it shares the run's synthetic checkpoints with the other workers."""

    os.environ[SHARED_ENV] = shared_checkpoints

    torch.set_num_threads(1)
    keep_freed_memory()
    suite_paths.map_checkpoints(mapped.items())


@functools.lru_cache(maxsize=4)
def _rebuilt(recipe: tuple[str, str], label: str):
    """This worker's copy of the parent's target; one that builds otherwise (another version, another
    policy) is refused rather than judged under the parent's label."""
    target = rebuild(*recipe)
    got = (target.label, getattr(target, "dtype", "fp32"))
    if got != (label, recipe[1]):
        raise RuntimeError(f"the worker built target {recipe[0]!r} as {got[0]} at {got[1]}, the parent ran "
                           f"{label} at {recipe[1]}")
    return target


def _on_target(spec, ctx, recipe: tuple[str, str], label: str, store: GoldenStore):
    return run_on_target(spec, ctx, _rebuilt(recipe, label), store)


def _dead_target(label: str, spec, folder: str, why):
    """A worker that died, or could not build the target, fails this row alone (a crash, as the
    target's own crash is reported)."""
    crash = f"crash: {why}"
    return TargetOutcome(spec, label, FAIL, message=crash[:300], messages=[
        f"{crash} (rerun with -j 1 to run it in this process)"])


def _dead_check(spec, folder: str, why) -> runner.Outcome:
    """A worker that died (a segfault, the OOM killer) is this row's CRASH, since a serial run would
    have died there too."""
    return runner.Outcome(spec, runner.CRASH, folder, messages=[
        f"crashed: {why} (run `lockstep check {spec.id} -j 1` to see it in this process)"])


def _dead_regen(spec, folder: str, why) -> runner.RegenOutcome:
    return runner.RegenOutcome(spec, runner.REFUSED, folder, explanation=[
        f"the worker process recording it failed: {why} (run `lockstep regen {spec.id} -j 1` to see it in this "
        "process)"])
