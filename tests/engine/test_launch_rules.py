"""engine/launch.py's rules without starting a rank: the plan, the launcher's polling loop over
stand-in processes that leave the files a rank leaves, the failure's text, a rank's own set-up with
torch.distributed replaced by recorders, and the helpers around them. tests/parallel/test_launch.py
starts real ranks for the same contracts end to end."""

from __future__ import annotations

import os
import shutil
import tempfile
from fractions import Fraction
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from lockstep.engine import launch as L
from lockstep.engine.launch import RankFailure, launch, plan


# --------------------------------------------------------------------------- plan
def test_the_plan_of_each_device():
    assert plan("cpu", 3, 0) == ("gloo", ["cpu"] * 3)
    assert plan("cpu", 2, 4, "gloo-host") == ("gloo-host", ["cpu", "cpu"])
    assert plan("cpu", 1, 0, "gloo") == ("gloo", ["cpu"])
    assert plan("cuda", 2, 2) == ("nccl", ["cuda:0", "cuda:1"])
    assert plan("cuda", 2, 3) == ("nccl", ["cuda:0", "cuda:1"])
    assert plan("cuda", 3, 2) == ("gloo-host", ["cuda:0", "cuda:1", "cuda:0"])
    assert plan("cuda", 2, 1, "gloo") == ("gloo", ["cuda:0", "cuda:0"])
    assert plan("cuda", 2, 2, "nccl") == ("nccl", ["cuda:0", "cuda:1"])
    assert plan("cuda", 1, 1, "gloo-host") == ("gloo-host", ["cuda:0"])


@pytest.mark.parametrize("args, message", [
    (("gpu", 1, 0), "launch: device must be 'cpu' or 'cuda', got 'gpu'"),
    (("cpu", 1, 0, "mpi"), "launch: transport must be one of ('gloo', 'nccl', 'gloo-host'), got 'mpi'"),
    (("cpu", 1, 1, "nccl"), "launch: the nccl transport needs device 'cuda'"),
    (("cuda", 1, 0), "launch: device 'cuda' asked for, but this machine has no CUDA GPU"),
    (("cuda", 3, 2, "nccl"), "launch: nccl needs a GPU per rank (3), this machine has 2; ranks sharing a GPU "
                             "use gloo-host"),
])
def test_the_plan_refuses(args, message):
    with pytest.raises(ValueError) as e:
        plan(*args)
    assert str(e.value) == message


# --------------------------------------------------------------------------- the launcher's loop
class _Proc:
    """A rank that, once started, has done what `how` says: "done" (its result file), "error" (its
    traceback file, exit 1), "die" (SIGKILL, no file), "exit0" (exit 0, no file), "hang"; "late"
    exits 1 and its traceback file shows only once it is joined; "slow" is done after 3 polls."""

    def __init__(self, launcher, target, name, daemon, args):
        self.launcher, self.target, self.name, self.daemon, self.args = launcher, target, name, daemon, args
        self.pid, self.exitcode, self.killed, self.joined = None, None, 0, []

    def start(self):
        rank, out = self.args[0], Path(self.args[10])
        how = self.launcher.hows[rank]
        self.pid = 1000 + rank
        if how == "done":
            torch.save({"rank": rank}, out / f"rank{rank}.pt")
            self.exitcode = 0
        elif how == "error":
            (out / f"rank{rank}.err").write_text(self.launcher.errors.get(rank, "Traceback\nValueError: boom\n"))
            self.exitcode = 1
        elif how == "die":
            self.exitcode = -9
        elif how == "exit0":
            self.exitcode = 0
        elif how == "late":
            self.exitcode = 1
        self.out, self.polls = out, 0

    @property
    def exitcode(self):
        if self.launcher.hows[self.args[0]] == "slow" and self.pid is not None:
            self.polls += 1
            if self.polls > 3:
                torch.save({"rank": self.args[0]}, self.out / f"rank{self.args[0]}.pt")
                return 0
        return self._exitcode

    @exitcode.setter
    def exitcode(self, value):
        self._exitcode = value

    def is_alive(self):
        return self.pid is not None and self.exitcode is None

    def kill(self):
        self.killed += 1

    def join(self, timeout=None):
        self.joined.append(timeout)
        if self.launcher.hows[self.args[0]] == "late" and self.pid is not None:
            (self.out / f"rank{self.args[0]}.err").write_text("Traceback\nKeyError: 'late'\n")


class _Launcher:
    def __init__(self, monkeypatch, tmp_path, hows, gpus=0, errors=None):
        self.hows, self.errors, self.procs, self.slept = hows, errors or {}, [], []
        self.out = tmp_path / "out"
        self.out.mkdir()
        self.clock = 100.0
        monkeypatch.setattr(L.lifeline, "run_folder", lambda prefix: self.made(prefix))
        monkeypatch.setattr(L, "_rank_context", lambda: SimpleNamespace(Process=self.process))
        monkeypatch.setattr(L, "_rendezvous_store", lambda w, t: self.store(w, t))
        monkeypatch.setattr(L, "_gpu_count", lambda: gpus)
        monkeypatch.setattr(L, "time", SimpleNamespace(monotonic=lambda: self.clock, sleep=self.sleep))

    def made(self, prefix):
        self.prefix = prefix
        return str(self.out)

    def store(self, world_size, timeout_s):
        self.store_args = (world_size, timeout_s)
        return SimpleNamespace(port=4321)

    def process(self, target, name, daemon, args):
        p = _Proc(self, target, name, daemon, args)
        self.procs.append(p)
        return p

    def sleep(self, s):
        self.slept.append(s)
        self.clock += 1.0


def _fn(x):
    return x


def test_results_come_back_in_rank_order_and_nothing_is_left(monkeypatch, tmp_path):
    run = _Launcher(monkeypatch, tmp_path, ["done", "done", "done"])
    monkeypatch.setenv("LOCKSTEP_LAUNCH_RULES_PROBE", "at the call")
    assert launch(_fn, 3, args=(1,), kwargs={"k": 2}, device="cpu", collective_timeout_s=7.0, threads=3) == [
        {"rank": 0}, {"rank": 1}, {"rank": 2}]
    assert run.prefix == "lockstep-launch" and run.store_args == (3, 7.0) and not run.out.exists()
    for r, p in enumerate(run.procs):
        assert (p.target, p.name, p.daemon) == (L._rank_main, f"lockstep-rank{r}", True)
        env = p.args[11]
        assert p.args[:11] == (r, 3, 4321, "gloo", "cpu", 7.0, 3, _fn, (1,), {"k": 2}, str(run.out))
        assert env["LOCKSTEP_LAUNCH_RULES_PROBE"] == "at the call" and env[L._LAUNCHER] == str(os.getpid())
        assert p.killed == 0 and p.joined == [5], "every rank is joined on the way out"
    assert run.slept == []
    assert L._LAUNCHER not in os.environ
    (tmp_path / "b").mkdir()
    run = _Launcher(monkeypatch, tmp_path / "b", ["done"])
    launch(_fn, 1, device="cpu")
    assert run.procs[0].args[6:10] == (1, _fn, (), {}), "one torch thread, no arguments: an empty kwargs"


def test_the_device_and_transport_of_a_launch(monkeypatch, tmp_path):
    cases = [(dict(device="cuda"), 2, ("cuda", "nccl")), (dict(device="cuda"), 1, ("cuda:0", "gloo-host")),
             (dict(device="cpu", transport="gloo-host"), 2, ("cpu", "gloo-host")),
             ({}, 2, ("cuda", "nccl")), ({}, 1, ("cpu", "gloo")), ({}, 0, ("cpu", "gloo"))]
    for i, (kw, gpus, (device, transport)) in enumerate(cases):
        (tmp_path / str(i)).mkdir()
        run = _Launcher(monkeypatch, tmp_path / str(i), ["done", "done"], gpus=gpus)
        launch(_fn, 2, **kw)
        assert run.procs[0].args[3] == transport and run.procs[1].args[4].startswith(device), (kw, gpus)


def test_without_a_device_the_transport_picks_it(monkeypatch, tmp_path):
    cases = [("nccl", 2, "nccl", "cuda:1"), ("gloo", 4, "gloo", "cpu"), ("gloo-host", 4, "gloo-host", "cpu"),
             (None, 2, "nccl", "cuda:1"), (None, 1, "gloo", "cpu")]
    for i, (transport, gpus, chosen, device) in enumerate(cases):
        (tmp_path / str(i)).mkdir()
        run = _Launcher(monkeypatch, tmp_path / str(i), ["done", "done"], gpus=gpus)
        launch(_fn, 2, transport=transport)
        assert run.procs[1].args[3:5] == (chosen, device), transport
    (tmp_path / "x").mkdir()
    _Launcher(monkeypatch, tmp_path / "x", ["done", "done"], gpus=1)
    with pytest.raises(ValueError, match="nccl needs a GPU per rank"):
        launch(_fn, 2, transport="nccl")


@pytest.mark.parametrize("world_size", [0, -1, True, 2.0, "2"])
def test_a_world_size_that_is_not_a_positive_int(world_size):
    with pytest.raises(ValueError) as e:
        launch(_fn, world_size)
    assert str(e.value) == f"launch: world_size must be a positive int, got {world_size!r}"


def test_a_raising_rank_and_a_hung_one_after_the_grace(monkeypatch, tmp_path):
    tb = "Traceback (most recent call last):\n  a\n  b\n  c\n\nValueError: boom\n\n"
    run = _Launcher(monkeypatch, tmp_path, ["error", "hang", "done"], errors={0: tb})
    with pytest.raises(RankFailure) as e:
        launch(_fn, 3, device="cpu", collective_timeout_s=3.0)
    assert run.slept == [0.05] * 6, "the grace is the collective timeout + 2 s: 5 s past the first failure"
    assert str(e.value) == ("launch(world_size=3) failed (after a rank failed): rank 0 raised ValueError: boom, "
                            "rank 1 hung: still running, no result; killed\n"
                            "  rank 0: raised ValueError: boom\n        b\n        c\n      \n      ValueError: boom\n"
                            "  rank 1: hung: still running, no result; killed\n"
                            "  rank 2: finished")
    assert e.value.ranks == {0: "raised ValueError: boom", 1: "hung: still running, no result; killed",
                             2: "finished"}
    assert [p.killed for p in run.procs] == [0, 2, 0], "the hung rank is killed (and again on the way out)"
    assert not run.out.exists()


def test_a_given_grace(monkeypatch, tmp_path):
    run = _Launcher(monkeypatch, tmp_path, ["error", "hang"])
    with pytest.raises(RankFailure):
        launch(_fn, 2, device="cpu", grace_s=1.5)
    assert len(run.slept) == 2


def test_ranks_that_died_fail_at_once(monkeypatch, tmp_path):
    run = _Launcher(monkeypatch, tmp_path, ["die", "exit0", "done"])
    with pytest.raises(RankFailure) as e:
        launch(_fn, 3, device="cpu")
    assert run.slept == [] and e.value.ranks == {0: "died without a result (signal SIGKILL)",
                                                 1: "died without a result (exit code 0)", 2: "finished"}
    assert str(e.value).startswith("launch(world_size=3) failed (after a rank failed): rank 0 died without a result "
                                   "(signal SIGKILL), rank 1 died without a result (exit code 0)\n")
    assert run.procs[0].joined[0] == 1 and run.procs[1].joined[0] == 1, "a finished rank is joined for its files"


def test_the_whole_run_timeout(monkeypatch, tmp_path):
    run = _Launcher(monkeypatch, tmp_path, ["hang", "done"])
    with pytest.raises(RankFailure) as e:
        launch(_fn, 2, device="cpu", timeout_s=2.5)
    assert len(run.slept) == 3
    assert str(e.value) == ("launch(world_size=2) failed (the run passed timeout_s=2.5): rank 0 hung: still running, "
                            "no result; killed\n  rank 0: hung: still running, no result; killed\n  rank 1: finished")


def test_a_start_that_fails_kills_the_started_ranks(monkeypatch, tmp_path):
    run = _Launcher(monkeypatch, tmp_path, ["hang", "boom"])
    real = _Proc.start

    def start(self):
        if self.launcher.hows[self.args[0]] == "boom":
            shutil.rmtree(run.out)            # the run's folder gone already (a sweep): never a second error
            raise OSError("cannot fork")
        real(self)

    monkeypatch.setattr(_Proc, "start", start)
    with pytest.raises(OSError, match="cannot fork"):
        launch(_fn, 2, device="cpu")
    assert [p.killed for p in run.procs] == [1, 0] and run.procs[1].joined == [] and not run.out.exists()


# --------------------------------------------------------------------------- the failure's text
def test_a_collective_error_is_a_consequence_unless_nothing_else_failed(tmp_path):
    procs = [SimpleNamespace(exitcode=None)] * 4
    (tmp_path / "rank0.err").write_text("x\nRuntimeError: Gloo connection closed by peer\n")
    (tmp_path / "rank1.err").write_text("KeyError: 'w'")
    f = L._failure(4, {0: "error", 1: "error", 2: "done", 3: "done"}, procs, tmp_path, "why")
    assert str(f).splitlines()[0] == "launch(world_size=4) failed (why): rank 1 raised KeyError: 'w'"
    assert str(f).splitlines()[1:4] == ["  rank 0: raised RuntimeError: Gloo connection closed by peer",
                                        "      x", "      RuntimeError: Gloo connection closed by peer"]
    f = L._failure(2, {0: "error", 1: "done"}, procs, tmp_path, "why")
    assert str(f).splitlines()[0] == ("launch(world_size=2) failed (why): rank 0 raised RuntimeError: Gloo connection "
                                      "closed by peer"), "only collective errors: they are the cause"
    for word in L._COLLECTIVE_MARKERS:
        (tmp_path / "rank1.err").write_text(f"E: a {word.upper()} b")
        f = L._failure(3, {0: "done", 1: "error", 2: "running"}, procs, tmp_path, "w")
        assert str(f).splitlines()[0] == ("launch(world_size=3) failed (w): rank 2 hung: still running, no result; "
                                          "killed"), word
    procs = [SimpleNamespace(exitcode=0), SimpleNamespace(exitcode=None), SimpleNamespace(exitcode=3)]
    assert list(L._failure(3, {0: "done", 1: "died", 2: "died"}, procs, tmp_path, "w").ranks.values()) == [
        "finished", "died without a result (exit code None)", "died without a result (exit code 3)"]


def test_the_last_line_of_a_traceback():
    assert L._last_line("a\n  b  \n\n   \n") == "b"
    assert L._last_line("") == "(empty traceback)" and L._last_line(" \n\n ") == "(empty traceback)"


# --------------------------------------------------------------------------- helpers
def test_kill_ends_the_started_ranks_only():
    class P:
        def __init__(self, pid, alive):
            self.pid, self.alive, self.calls = pid, alive, []

        def is_alive(self):
            return self.alive

        def kill(self):
            self.calls.append("kill")

        def join(self, timeout):
            self.calls.append(("join", timeout))

    procs = [P(None, True), P(1, True), P(2, False)]
    L._kill(procs)
    assert [p.calls for p in procs] == [[], ["kill", ("join", 5)], [("join", 5)]]


def test_the_callers_environment_is_a_copy_marked_with_the_launcher(monkeypatch):
    monkeypatch.setenv("LOCKSTEP_LAUNCH_RULES_PROBE", "x")
    env = L._caller_environment()
    assert env == dict(os.environ) | {L._LAUNCHER: str(os.getpid())} and L._LAUNCHER not in os.environ
    assert L._LAUNCHER == "_LOCKSTEP_LAUNCHER_PID"


def test_the_gpu_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert L._gpu_count() == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert L._gpu_count() == 3


def test_the_rank_context(monkeypatch):
    made = []

    class Ctx:
        def __init__(self, how):
            self.how, self.preload = how, None

        def set_forkserver_preload(self, names):
            self.preload = names

    monkeypatch.setattr(L.mp, "get_context", lambda how: made.append(Ctx(how)) or made[-1])
    monkeypatch.setattr(L, "_short_socket_dir", lambda: made.append("short"))
    monkeypatch.setattr(L.mp, "get_all_start_methods", lambda: ["fork", "spawn"])
    assert L._rank_context().how == "spawn" and made[0].how == "spawn" and made[0].preload is None
    made.clear()
    monkeypatch.setattr(L.mp, "get_all_start_methods", lambda: ["fork", "spawn", "forkserver"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ctx = L._rank_context()
    assert made[0] == "short" and ctx.how == "forkserver"
    assert ctx.preload == ["torch", "torch.distributed", "lockstep.engine.parallel"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert L._rank_context().preload == ["torch", "torch.distributed"]


def test_the_socket_folder_under_a_long_temp_dir(monkeypatch):
    made = []
    monkeypatch.setattr(L.util, "get_temp_dir", lambda: made.append(tempfile.tempdir))
    monkeypatch.setattr(tempfile, "tempdir", "/the/callers")
    for room in (L.SOCKET_DIR_ROOM, 200):
        monkeypatch.setattr(tempfile, "gettempdir", lambda r=room: "x" * r)
        writable = {"/var/tmp", "/dev/shm"}
        monkeypatch.setattr(L.os.path, "isdir", lambda d: d != "/dev/shm")
        monkeypatch.setattr(L.os, "access", lambda d, mode: mode == os.W_OK and d in writable)
        L._short_socket_dir()
    assert L.SOCKET_DIR_ROOM == 64
    monkeypatch.setattr(tempfile, "gettempdir", lambda: "x" * 65)
    L._short_socket_dir()
    assert made == ["/var/tmp", "/var/tmp"] and tempfile.tempdir == "/the/callers", \
        "the first writable folder, only while multiprocessing makes its own; 64 characters still fit"
    for dirs, writable, chosen in (({"/tmp", "/var/tmp", "/dev/shm"}, {"/tmp", "/var/tmp", "/dev/shm"}, "/tmp"),
                                   ({"/dev/shm", "/var/tmp"}, {"/dev/shm", "/tmp"}, "/dev/shm")):
        made.clear()
        monkeypatch.setattr(L.os.path, "isdir", lambda d, dirs=dirs: d in dirs)
        monkeypatch.setattr(L.os, "access", lambda d, mode, w=writable: d in w)
        L._short_socket_dir()
        assert made == [chosen], (dirs, writable)
    monkeypatch.setattr(L.os.path, "isdir", lambda d: False)
    L._short_socket_dir()
    assert made == ["/dev/shm"], "no short folder: nothing moves"

    def fails():
        raise OSError("full")

    monkeypatch.setattr(L.os.path, "isdir", lambda d: True)
    monkeypatch.setattr(L.os, "access", lambda d, mode: True)
    monkeypatch.setattr(L.util, "get_temp_dir", fails)
    with pytest.raises(OSError):
        L._short_socket_dir()
    assert tempfile.tempdir == "/the/callers"


def test_process_group_options(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.delenv("TORCH_NCCL_BLOCKING_WAIT", raising=False)
    L.process_group_options("nccl", 0)
    assert os.environ["TORCH_NCCL_BLOCKING_WAIT"] == "1", "a timed-out collective raises in Python"
    chosen.clear()
    monkeypatch.setenv("TORCH_NCCL_BLOCKING_WAIT", "0")
    assert L.process_group_options("gloo", 1) == {} and chosen == []
    assert L.process_group_options("nccl", 2) == {"device_id": torch.device("cuda", 2)}
    assert chosen == [torch.device("cuda", 2)] and os.environ["TORCH_NCCL_BLOCKING_WAIT"] == "0", "a set one is kept"
    monkeypatch.setattr(dist, "init_process_group", lambda backend, store, rank, world_size, timeout: None)
    assert L.process_group_options("nccl", 0) == {}, "a torch without device_id"


# --------------------------------------------------------------------------- a rank's own set-up, in this process
class _Exit(Exception):
    pass


@pytest.fixture
def rank(monkeypatch, tmp_path):
    seen = []
    environ = {"BEFORE": "the server's"}

    def _exit(code):
        seen.append(("exit", code))
        raise _Exit

    fake_os = SimpleNamespace(environ=environ, getppid=lambda: 77, replace=os.replace, _exit=_exit)
    monkeypatch.setattr(L, "os", fake_os)
    monkeypatch.setattr(L.lifeline, "kill_on_parent_death", lambda: seen.append("lifeline"))
    monkeypatch.setattr(L.lifeline, "watch_parent", lambda parent, launcher: seen.append(("watch", parent, launcher)))
    monkeypatch.setattr(dist, "TCPStore", lambda *a, **k: seen.append(("store", a, k)) or "the store")
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: seen.append(("init", a, k, dict(environ))))
    monkeypatch.setattr(dist, "barrier", lambda: seen.append("barrier"))
    monkeypatch.setattr(dist, "destroy_process_group", lambda: seen.append("destroy"))
    monkeypatch.setattr(torch, "set_num_threads", lambda n: seen.append(("threads", n)))
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: seen.append(("cuda", d)))
    monkeypatch.setattr(L, "process_group_options", lambda backend, gpu: seen.append(("options", backend, gpu)) or
                        ({"device_id": gpu} if backend == "nccl" else {}))
    return SimpleNamespace(seen=seen, environ=environ, out=tmp_path)


def _rank_fn(*args, **kwargs):
    if kwargs.get("fail"):
        raise KeyError("in fn")
    return {"args": args, "kwargs": kwargs}


def test_a_rank_takes_the_callers_environment_and_writes_its_result(rank):
    env = {"CALLER": "yes", L._LAUNCHER: "55"}
    L._rank_main(1, 2, 4321, "gloo", "cpu", 3.0, 2, _rank_fn, (1,), {"k": 2}, str(rank.out), env)
    vars_ = {"CALLER": "yes", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "4321", "RANK": "1", "WORLD_SIZE": "2",
             "LOCAL_RANK": "1", "LOCKSTEP_DEVICE": "cpu", "LOCKSTEP_TRANSPORT": "gloo"}
    assert rank.environ == vars_, "the server's own environment is gone, the launcher's pid never set"
    timeout = timedelta(seconds=3.0)
    assert rank.seen == [
        "lifeline", ("watch", 77, 55), ("threads", 2),
        ("store", ("127.0.0.1", 4321, 2), {"is_master": False, "timeout": timeout, "wait_for_workers": False}),
        ("options", "gloo", 1),
        ("init", ("gloo",), {"store": "the store", "rank": 1, "world_size": 2, "timeout": timeout}, vars_),
        "barrier", "destroy"]
    assert torch.load(rank.out / "rank1.pt") == {"args": (1,), "kwargs": {"k": 2}}
    assert sorted(p.name for p in rank.out.iterdir()) == ["rank1.pt"]


def test_a_rank_on_a_gpu(rank):
    L._rank_main(0, 2, 1, "nccl", "cuda:1", 3.0, None, _rank_fn, (), {}, str(rank.out), {})
    assert ("watch", 77, None) in rank.seen and not any(s[0] == "threads" for s in rank.seen if isinstance(s, tuple))
    assert ("cuda", torch.device("cuda:1")) in rank.seen and ("options", "nccl", 1) in rank.seen
    init = next(s for s in rank.seen if s[0] == "init")
    assert init[1] == ("nccl",) and init[2]["device_id"] == 1
    rank.seen.clear()
    L._rank_main(1, 2, 1, "gloo-host", "cuda:0", 3.0, 0, _rank_fn, (), {}, str(rank.out), {})
    assert ("options", "gloo", 0) in rank.seen and ("cuda", torch.device("cuda:0")) in rank.seen
    assert not any(isinstance(s, tuple) and s[0] == "threads" for s in rank.seen)


def test_a_rank_that_raises_leaves_its_traceback_and_exits_1(rank):
    with pytest.raises(_Exit):
        L._rank_main(0, 1, 1, "gloo", "cpu", 3.0, 1, _rank_fn, (), {"fail": True}, str(rank.out), {})
    assert rank.seen[-1] == ("exit", 1) and "barrier" not in rank.seen
    text = (rank.out / "rank0.err").read_text()
    assert text.startswith("Traceback (most recent call last):") and text.endswith("KeyError: 'in fn'\n")
    assert not (rank.out / "rank0.pt").exists()


def test_the_default_timeouts(monkeypatch, tmp_path):
    run = _Launcher(monkeypatch, tmp_path, ["hang"])
    with pytest.raises(RankFailure) as e:
        launch(_fn, 1, device="cpu")
    assert run.store_args == (1, 60.0) and "(the run passed timeout_s=600)" in str(e.value)
    assert len(run.slept) == 601


def test_the_rendezvous_store_listens_before_any_rank(monkeypatch):
    seen = []
    monkeypatch.setattr(dist, "TCPStore", lambda *a, **k: seen.append((a, k)) or "store")
    assert L._rendezvous_store(3, 7.5) == "store"
    assert seen == [(("127.0.0.1", 0, 3), {"is_master": True, "timeout": timedelta(seconds=7.5),
                                           "wait_for_workers": False})]


def test_a_rank_whose_traceback_shows_after_its_exit_raised(monkeypatch, tmp_path):
    run = _Launcher(monkeypatch, tmp_path, ["late", "done"])
    with pytest.raises(RankFailure) as e:
        launch(_fn, 2, device="cpu")
    assert e.value.ranks == {0: "raised KeyError: 'late'", 1: "finished"} and run.slept == []


def test_a_rank_still_running_is_not_a_failure(monkeypatch, tmp_path):
    run = _Launcher(monkeypatch, tmp_path, ["done", "slow"])
    assert launch(_fn, 2, device="cpu", grace_s=0.5) == [{"rank": 0}, {"rank": 1}]
    assert len(run.slept) == 3


def test_results_are_any_picklable_object(monkeypatch, tmp_path):
    run = _Launcher(monkeypatch, tmp_path, ["done"])
    real = _Proc.start

    def start(self):
        real(self)
        torch.save(Fraction(1, 3), Path(self.args[10]) / "rank0.pt")   # not a weights-only type

    monkeypatch.setattr(_Proc, "start", start)
    assert launch(_fn, 1, device="cpu") == [Fraction(1, 3)] and run.procs


def test_the_run_timeout_is_exclusive_and_names_each_ranks_state(monkeypatch, tmp_path):
    run = _Launcher(monkeypatch, tmp_path, ["error", "die", "hang"])
    with pytest.raises(RankFailure) as e:
        launch(_fn, 3, device="cpu", timeout_s=2.0, grace_s=100.0)
    assert len(run.slept) == 3, "the run ends once it is past timeout_s, not at it"
    assert str(e.value).startswith("launch(world_size=3) failed (the run passed timeout_s=2): rank 0 raised ")
    assert e.value.ranks == {0: "raised ValueError: boom", 1: "died without a result (signal SIGKILL)",
                             2: "hung: still running, no result; killed"}
