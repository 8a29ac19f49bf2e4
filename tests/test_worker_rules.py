"""harness/workers.py's rules without spawning a worker: how many processes a run takes, the rows
handed out and answered in their order, a dead worker's row, the pool's bookkeeping with stand-in
workers, one worker's loop over a real pipe, and what a worker does at its start and its end."""

from __future__ import annotations

import multiprocessing
import os
from types import SimpleNamespace

import pytest
import torch

from lockstep.harness import runner, suite_paths, workers
from lockstep.harness.checkpoints import SHARED_ENV
from lockstep.harness.errors import UsageError


def test_the_cores_are_the_affinity_mask(monkeypatch):
    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert workers.cores() == 3
    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda pid: set(), raising=False)
    assert workers.cores() == 1

    def no_masks(pid):
        raise AttributeError

    monkeypatch.setattr(workers.os, "sched_getaffinity", no_masks, raising=False)
    monkeypatch.setattr(workers.os, "cpu_count", lambda: 6)
    assert workers.cores() == 6
    monkeypatch.setattr(workers.os, "cpu_count", lambda: None)
    assert workers.cores() == 1
    monkeypatch.setattr(workers.os, "cpu_count", lambda: 0)
    assert workers.cores() == 1


def test_the_default_jobs(monkeypatch):
    monkeypatch.setattr(workers, "cores", lambda: 7)
    monkeypatch.delenv(workers.JOBS_ENV, raising=False)
    assert workers.default_jobs() == 7
    for text, jobs in (("  ", 7), ("", 7), ("1", 1), (" 3 ", 3)):
        monkeypatch.setenv("LOCKSTEP_JOBS", text)
        assert workers.default_jobs() == jobs, text
    for text, why in (("two", "expected a whole number, as -j takes"), ("0", "must be at least 1, as -j"),
                      ("-2", "must be at least 1, as -j")):
        monkeypatch.setenv("LOCKSTEP_JOBS", text)
        with pytest.raises(UsageError) as e:
            workers.default_jobs()
        assert str(e.value) == f"$LOCKSTEP_JOBS={text!r}: {why}"


def test_the_processes_a_run_takes(monkeypatch):
    monkeypatch.setattr(workers, "joined", lambda: False)
    monkeypatch.setattr(workers, "default_jobs", lambda: 5)
    assert [workers.processes(None, rows) for rows in (0, 1, 4, 5, 9)] == [1, 1, 4, 5, 5]
    assert [workers.processes(3, rows) for rows in (2, 3, 8)] == [2, 3, 3]
    monkeypatch.setattr(workers, "joined", lambda: True)
    assert workers.processes(3, 8) == 1, "under torchrun its ranks serve this one process"


def _rows(n):
    return [(SimpleNamespace(id=f"s/{i}"), f"ctx{i}", f"folder{i}") for i in range(n)]


class _Pool:
    """A stand-in _Pool: runs each task in this process when asked for its result; `dies` are the
    indices whose worker 'died'."""
    made: list = []
    dies: set = set()

    def __init__(self, jobs, initargs):
        self.jobs, self.initargs, self.closed, self.asked = jobs, initargs, False, []
        _Pool.made.append(self)

    def start(self, tasks):
        self.tasks = tasks

    def result(self, index):
        self.asked.append(index)
        if index in _Pool.dies:
            return False, "signal SIGKILL"
        fn, args = self.tasks[index]
        return True, fn(*args)

    def close(self):
        self.closed = True


@pytest.fixture
def pool(monkeypatch, tmp_path):
    _Pool.made, _Pool.dies = [], set()
    monkeypatch.setattr(workers, "_Pool", _Pool)
    monkeypatch.setattr(workers, "cores", lambda: 2)
    monkeypatch.setattr(workers, "joined", lambda: False)
    monkeypatch.setattr(workers, "keep_freed_memory", lambda: None)
    swept = []
    monkeypatch.setattr(workers.lifeline, "sweep", lambda: swept.append(1))
    monkeypatch.setattr(workers.lifeline, "run_folder", lambda prefix: str(tmp_path / prefix))
    monkeypatch.delenv(SHARED_ENV, raising=False)
    return SimpleNamespace(swept=swept, tmp=tmp_path)


def test_rows_run_serially_in_order(pool, monkeypatch):
    freed, waited = [], []
    monkeypatch.setattr(workers, "keep_freed_memory", lambda: freed.append(1))
    out = list(workers._run_rows(_rows(3), lambda s, c: (s.id, c), 1, lambda i, sid: waited.append((i, sid)), None))
    assert out == [("s/0", "ctx0"), ("s/1", "ctx1"), ("s/2", "ctx2")]
    assert waited == [(1, "s/0"), (2, "s/1"), (3, "s/2")] and freed == [1] and _Pool.made == []
    assert list(workers._run_rows([], lambda s, c: c, 4, None, None)) == [] and _Pool.made == []


def test_rows_run_in_a_pool_answer_in_order(pool, capsys):
    (pool.tmp / "lockstep-shared-checkpoints").mkdir()
    waited = []
    _Pool.dies = {1}
    out = list(workers._run_rows(_rows(3), lambda s, c: (s.id, c), 3, lambda i, sid: waited.append((i, sid)),
                                 lambda spec, folder, why: ("dead", spec.id, folder, why)))
    assert out == [("s/0", "ctx0"), ("dead", "s/1", "folder1", "signal SIGKILL"), ("s/2", "ctx2")]
    assert waited == [(1, "s/0"), (2, "s/1"), (3, "s/2")]
    (p,) = _Pool.made
    assert p.jobs == 3 and p.asked == [0, 1, 2] and p.closed and pool.swept == [1]
    assert p.initargs == (suite_paths.explicit_mappings(), str(pool.tmp / "lockstep-shared-checkpoints"))
    assert not (pool.tmp / "lockstep-shared-checkpoints").exists(), "the run's own shared folder is removed"
    assert capsys.readouterr().err == (
        "note: -j 3 is more than the 2 cores available: 3 worker processes (each its own torch, a few hundred MB) "
        "take turns on them\n")
    _Pool.dies = set()
    list(workers._run_rows(_rows(2), lambda s, c: c, 2, None, None))
    assert capsys.readouterr().err == "", "as many workers as cores: no note"


def test_a_shared_folder_the_user_named_is_kept(pool, monkeypatch):
    named = pool.tmp / "mine"
    named.mkdir()
    monkeypatch.setenv(SHARED_ENV, str(named))
    list(workers._run_rows(_rows(2), lambda s, c: c, 2, None, None))
    assert _Pool.made[0].initargs[1] == str(named) and named.is_dir()


def test_an_interrupted_run_closes_its_pool(pool):
    rows = workers._run_rows(_rows(3), lambda s, c: c, 2, None, None)
    assert next(rows) == "ctx0"
    rows.close()
    assert _Pool.made[0].closed and not (pool.tmp / "lockstep-shared-checkpoints").exists()


def test_check_and_regen_rows_hand_on_their_options(monkeypatch):
    seen = []
    monkeypatch.setattr(workers, "_run_rows", lambda rows, call, jobs, waiting, dead: iter(
        [seen.append((rows, call.func, call.keywords, jobs, waiting, dead))]))
    list(workers.check_rows(["r"], "store", True, 4, print))
    list(workers.regen_rows(["r"], "store", False, 2, repr))
    assert seen == [(["r"], runner.check_spec, {"store": "store", "strict": True}, 4, print, workers._dead_check),
                    (["r"], runner.regen_spec, {"store": "store", "write": False}, 2, repr, workers._dead_regen)]


def test_a_dead_workers_row():
    spec = SimpleNamespace(id="a/b")
    out = workers._dead_check(spec, "cpu-fp32", "why")
    assert (out.spec, out.status, out.golden_platform, out.messages) == (
        spec, runner.CRASH, "cpu-fp32", ["crashed: why (run `lockstep check a/b -j 1` to see it in this process)"])
    out = workers._dead_regen(spec, "cpu-fp32", "why")
    assert (out.spec, out.status, out.golden_platform, out.explanation) == (
        spec, runner.REFUSED, "cpu-fp32",
        ["the worker process recording it failed: why (run `lockstep regen a/b -j 1` to see it in this process)"])


def test_how_a_worker_ended():
    assert workers._how(-9) == "signal SIGKILL" and workers._how(-11) == "signal SIGSEGV"
    assert workers._how(-200) == "signal 200"
    assert workers._how(3) == "exit code 3" and workers._how(0) == "exit code 0"
    assert workers._how(None) == "exit code None"


# --------------------------------------------------------------------------- one worker, over a real pipe
def _recv(conn):
    """What the other end sent; a failure (never a hang) when nothing comes within 5 s."""
    assert conn.poll(5), "nothing was sent"
    return conn.recv()


def _unsendable():
    return lambda: None                       # a lambda does not pickle


class _Proc:
    def __init__(self, alive=True, exitcode=None):
        self.alive, self.exitcode, self.killed, self.joined = alive, exitcode, 0, []
        self.started, self.ends_on_join = False, True
        self.sentinel = object()

    def start(self):
        self.started = True

    def is_alive(self):
        return self.alive

    def kill(self):
        self.killed += 1
        self.alive = False

    def join(self, timeout=None):
        self.joined.append(timeout)
        self.alive = self.alive and not self.ends_on_join


class _Ctx:
    def __init__(self, proc=None):
        self.made, self.proc = [], proc

    def Pipe(self):
        return multiprocessing.Pipe()

    def Process(self, target, args, name):
        self.made.append((target, args, name))
        self.child = args[0]
        return self.proc or _Proc()


def test_a_worker_is_given_a_task_and_answers_it():
    ctx = _Ctx()
    w = workers._Worker(ctx, ("init",))
    ((target, (child, parent, initargs), name),) = ctx.made
    assert (target, parent, initargs, name) == (workers._worker_main, os.getpid(), ("init",), "lockstep-check-worker")
    assert w.proc.started and w.task is None and child.closed
    # the child end was closed in this process, as after a real start: talk over a fresh pair
    parent_end, child_end = multiprocessing.Pipe()
    w.conn = parent_end
    w.give(4, "the task")
    assert w.task == 4 and _recv(child_end) == "the task"
    child_end.send((True, "done"))
    assert w.take() == (4, True, "done") and w.task is None
    w.task = 5
    child_end.close()
    w.proc.exitcode = -9
    assert w.take() == (5, False, "the worker process checking it died (signal SIGKILL)")
    assert w.proc.joined == [5]


def test_a_worker_is_stopped_or_killed():
    ctx = _Ctx()
    w = workers._Worker(ctx, ())
    parent_end, child_end = multiprocessing.Pipe()
    w.conn = parent_end
    w.stop()
    assert _recv(child_end) is None and w.proc.killed == 0, "an idle worker is told to stop"
    w.task = 1
    w.stop()
    assert w.proc.killed == 1 and not child_end.poll(), "a busy one is killed"
    w.task = None
    parent_end.close()
    w.stop()                                  # a pipe already gone: nothing raised
    w.give(2, "x")
    assert w.task == 2


def test_a_worker_loop_answers_each_task_until_told_to_stop(monkeypatch):
    seen, deaths = [], []
    monkeypatch.setattr(workers.lifeline, "watch_parent",
                        lambda parent, on_death: seen.append(("watch", parent)) or deaths.append(on_death))
    monkeypatch.setattr(workers, "_leave", lambda parent: seen.append(("leave", parent)))
    monkeypatch.setattr(workers, "_start_worker", lambda *a: seen.append(("start", a)))
    here, there = multiprocessing.Pipe()

    for task in [(divmod, (7, 2)), (int, ("x",)), (_unsendable, ()), None]:
        here.send(task)
    workers._worker_main(there, 41, ("a", "b"))
    assert seen == [("watch", 41), ("start", ("a", "b"))]
    deaths[0]()
    assert seen[-1] == ("leave", 41), "the parent's death removes the parent's folders"
    assert _recv(here) == (True, (3, 1))
    assert _recv(here) == (False, "ValueError: invalid literal for int() with base 10: 'x'")
    ok, why = _recv(here)
    assert not ok and why.startswith(("AttributeError: ", "PicklingError: ")), why
    assert not here.poll()
    here.close()
    workers._worker_main(there, 41, ())       # the parent's end gone: the loop ends


def test_a_worker_starts_as_its_parent_was(monkeypatch, tmp_path):
    threads = torch.get_num_threads()
    saved = dict(suite_paths._MAPPED)
    freed = []
    monkeypatch.setattr(workers, "keep_freed_memory", lambda: freed.append(1))
    monkeypatch.setenv(SHARED_ENV, "before")
    try:
        workers._start_worker({"a/b": tmp_path / "c"}, str(tmp_path / "shared"))
        assert os.environ[SHARED_ENV] == str(tmp_path / "shared")
        assert torch.get_num_threads() == 1 and freed == [1]
        assert suite_paths.explicit_mappings()["a/b"] == tmp_path / "c"
    finally:
        torch.set_num_threads(threads)
        suite_paths._MAPPED.clear()
        suite_paths._MAPPED.update(saved)


def test_a_worker_whose_parent_died_leaves_nothing(monkeypatch, tmp_path):
    removed, killed = [], []
    monkeypatch.setattr(workers.lifeline, "remove_own_folders", lambda pid=None: removed.append(pid))
    temp = tmp_path / "mp"
    temp.mkdir()
    config = multiprocessing.current_process()._config
    monkeypatch.setitem(config, "tempdir", str(temp))
    monkeypatch.setattr(workers.multiprocessing, "active_children",
                        lambda: [SimpleNamespace(kill=lambda: killed.append(1))] * 2)
    workers._leave(77)
    assert removed == [77, None] and not temp.exists() and killed == [1, 1]
    workers._leave(78)                        # the folder gone already: nothing raised
    monkeypatch.setitem(config, "tempdir", None)
    workers._leave(79)                        # no fork server's folder: nothing to remove


# --------------------------------------------------------------------------- the pool, with stand-in workers
def _bounded(wait):
    """multiprocessing.connection.wait's stand-in: a pool that keeps waiting (a lost task) fails."""
    calls = []

    def bounded(objs):
        calls.append(1)
        assert len(calls) < 50, "the pool waits for a task no worker holds"
        return wait(objs)

    return bounded


class _FakeWorker:
    """A worker whose answer is ready at once: `dies` makes the next one it takes a death."""
    made: list = []

    def __init__(self, ctx, initargs):
        self.ctx, self.initargs, self.task, self.given, self.stopped = ctx, initargs, None, [], False
        self.conn, self.proc = object(), _Proc()
        self.dies = False
        _FakeWorker.made.append(self)

    def give(self, index, task):
        self.task = index
        self.given.append((index, task))

    def take(self):
        index, self.task = self.task, None
        if self.dies:
            self.proc.alive = False
            return index, False, "died"
        return index, True, ("answer", self.given[-1][1])

    def stop(self):
        self.stopped = True


def test_the_pool_feeds_each_worker_one_task_and_replaces_a_dead_one(monkeypatch):
    _FakeWorker.made = []
    monkeypatch.setattr(workers, "_Worker", _FakeWorker)
    monkeypatch.setattr(workers.multiprocessing, "get_context", lambda how: ("context", how))
    monkeypatch.setattr(workers, "wait", _bounded(lambda objs: objs))
    pool = workers._Pool(2, ("i",))
    assert pool.ctx == ("context", "spawn")
    pool.start(["t0", "t1", "t2", "t3", "t4"])
    a, b = _FakeWorker.made
    assert a.initargs == ("i",) and a.ctx == ("context", "spawn")
    assert a.given == [(0, "t0")] and b.given == [(1, "t1")] and pool.next == 2
    b.dies = True
    assert pool.result(1) == (False, "died")
    c = _FakeWorker.made[2]
    assert pool.workers == [a, c] and c.given == [(3, "t3")], "a new worker takes the dead one's place"
    assert (c.ctx, c.initargs) == (("context", "spawn"), ("i",)), "started as the first ones were"
    assert a.given == [(0, "t0"), (2, "t2")]
    assert pool.result(0) == (True, ("answer", "t0")) and 0 not in pool.done
    assert pool.result(2) == (True, ("answer", "t2")) and pool.result(3) == (True, ("answer", "t3"))
    assert pool.result(4) == (True, ("answer", "t4"))
    pool.close()
    assert all(w.stopped and w.proc.joined == [5] and not w.proc.killed for w in pool.workers)


def test_the_pool_takes_no_more_workers_than_tasks_and_kills_one_that_will_not_end(monkeypatch):
    _FakeWorker.made = []
    monkeypatch.setattr(workers, "_Worker", _FakeWorker)
    monkeypatch.setattr(workers, "wait", _bounded(lambda objs: objs))
    pool = workers._Pool(4, ())
    pool.start(["t0"])
    (a,) = _FakeWorker.made
    a.dies = True
    assert pool.result(0) == (False, "died") and pool.workers == [a], "no task left: no new worker"
    a.proc.alive, a.proc.ends_on_join = True, False
    pool.close()
    assert a.proc.killed == 1 and a.proc.joined == [5, 5]
    pool = workers._Pool(4, ())
    pool.start([])
    assert len(_FakeWorker.made) == 1


def test_the_pool_waits_on_the_busy_workers_only(monkeypatch):
    _FakeWorker.made = []
    monkeypatch.setattr(workers, "_Worker", _FakeWorker)
    waited = []
    # b has answered and is still alive: its pipe is ready, its sentinel is not
    monkeypatch.setattr(workers, "wait", _bounded(lambda objs: waited.append(list(objs)) or objs[1:2]))
    pool = workers._Pool(2, ())
    pool.start(["t0", "t1", "t2"])
    a, b = _FakeWorker.made
    assert pool.result(1) == (True, ("answer", "t1"))
    assert waited == [[a.conn, b.conn, a.proc.sentinel, b.proc.sentinel]]
    assert a.given == [(0, "t0")] and b.given == [(1, "t1"), (2, "t2")], "only the ready worker was answered"


# --------------------------------------------------------------------------- another engine's rows
def test_target_rows_rebuild_the_target_in_each_worker(monkeypatch):
    seen = []
    monkeypatch.setattr(workers, "_run_rows", lambda rows, call, jobs, waiting, dead: iter(
        [seen.append((rows, call.func, call.keywords, jobs, waiting, dead.func, dead.args))]))
    list(workers.target_rows(["r"], ("peer", "bf16"), "peer 1.0", "store", 3, print))
    assert seen == [(["r"], workers._on_target, {"recipe": ("peer", "bf16"), "label": "peer 1.0", "store": "store"},
                     3, print, workers._dead_target, ("peer 1.0",))]


def test_a_worker_builds_the_parents_target_once_or_refuses_another(monkeypatch):
    built = []

    def rebuild(name, dtype):
        built.append((name, dtype))
        return SimpleNamespace(label=f"{name} 1.0" if name != "other" else "other 2.0", dtype=dtype)

    monkeypatch.setattr(workers, "rebuild", rebuild)
    workers._rebuilt.cache_clear()
    try:
        a = workers._rebuilt(("peer", "bf16"), "peer 1.0")
        assert (a.label, a.dtype) == ("peer 1.0", "bf16") and workers._rebuilt(("peer", "bf16"), "peer 1.0") is a
        assert built == [("peer", "bf16")], "built once per worker"
        with pytest.raises(RuntimeError) as e:
            workers._rebuilt(("other", "fp32"), "other 1.0")
        assert str(e.value) == "the worker built target 'other' as other 2.0 at fp32, the parent ran other 1.0 at fp32"
        workers._rebuilt.cache_clear()
        monkeypatch.setattr(workers, "rebuild", lambda n, d: SimpleNamespace(label="peer 1.0"))
        assert workers._rebuilt(("peer", "fp32"), "peer 1.0").label == "peer 1.0", "no dtype attribute: fp32"
        with pytest.raises(RuntimeError) as e:
            workers._rebuilt(("peer", "bf16"), "peer 1.0")      # the right label at another policy
        assert str(e.value) == "the worker built target 'peer' as peer 1.0 at fp32, the parent ran peer 1.0 at bf16"
        workers._rebuilt.cache_clear()
        monkeypatch.setattr(workers, "rebuild", rebuild)
        seen = []
        monkeypatch.setattr(workers, "run_on_target", lambda spec, ctx, target, store: seen.append(
            (spec, ctx, target, store)) or "outcome")
        assert workers._on_target("spec", "ctx", ("peer", "bf16"), "peer 1.0", "store") == "outcome"
        assert seen == [("spec", "ctx", a, "store")]
    finally:
        workers._rebuilt.cache_clear()


def test_a_dead_workers_target_row():
    spec = SimpleNamespace(id="a/b")
    out = workers._dead_target("peer 1.0", spec, "cpu-fp32", "x" * 400)
    assert (out.spec, out.target, out.status) == (spec, "peer 1.0", workers.FAIL)
    assert out.message == ("crash: " + "x" * 400)[:300]
    assert out.messages == ["crash: " + "x" * 400 + " (rerun with -j 1 to run it in this process)"]
