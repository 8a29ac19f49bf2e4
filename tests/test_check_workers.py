"""`lockstep check -j N`'s workers (harness/workers.py, engine/lifeline.py): they end with the process
that started them, whatever ends it; the run's temp folders go with them (or with the next run); a
worker that dies costs only its own row; $LOCKSTEP_JOBS is read as -j is.

The kill tests run `lockstep` in a subprocess with a private TMPDIR and are bounded in time.
LOCKSTEP_KILL_LOOPS=N repeats the parent kill N times (the notes' kill loop)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from lockstep.engine import lifeline
from lockstep.harness import workers as check_workers
from lockstep.harness.cli import main

from .conftest import REPO

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc for process trees")


def children(pid: int) -> set[int]:
    """Every live descendant of `pid` (read from /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] != "Z":
                parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for c in parents.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def alive(pids) -> set[int]:
    out = set()
    for p in pids:
        try:
            state = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        if state[state.rindex(")") + 2] != "Z":
            out.add(p)
    return out


def lockstep(args, tmp: Path, cwd=REPO, **kw):
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=str(REPO))
    env.pop("LOCKSTEP_JOBS", None)
    env.pop("LOCKSTEP_CHECKPOINT_CACHE", None)
    return subprocess.Popen([sys.executable, "-m", "lockstep", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def workers(pid: int) -> set[int]:
    """The spawned check workers among `pid`'s descendants."""
    out = set()
    for c in children(pid):
        try:
            if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes():
                out.add(c)
        except OSError:
            pass
    return out


def wait_for(cond, timeout_s: float):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    return cond()


def kill_parent_once(tmp: Path) -> tuple[set[int], list[str]]:
    """SIGKILL a `check -j 2` of the topology specs once its ranks run -> (survivors up to 60 s later,
    the run folders left in its TMPDIR)."""
    proc = lockstep(["check", "-j", "2", "topology/*"], tmp)
    try:
        # ranks are the workers' grandchildren (via the fork server): wait until some run
        ranks = wait_for(lambda: len(children(proc.pid)) >= 4 and children(proc.pid), 120)   # workers, a fork server, a rank
        seen = children(proc.pid)
        if not (ranks and proc.poll() is None):
            out, err = proc.communicate(timeout=60)
            raise AssertionError(f"the check finished before its ranks could be seen (exit {proc.returncode}):\n"
                                 f"{out[-2000:]}\n{err[-2000:]}")
        proc.kill()
        proc.wait(timeout=10)
        wait_for(lambda: not alive(seen), 60)           # a loaded machine (CI under -n 2) is slow to reap
        survivors = alive(seen)
        left = sorted(p.name for p in tmp.iterdir())          # multiprocessing's own pymp-* too
        return survivors, left
    finally:
        for p in alive(children(proc.pid)):
            os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_killing_the_parent_ends_every_worker_and_rank():
    loops = int(os.environ.get("LOCKSTEP_KILL_LOOPS", "1"))
    results = []
    for _ in range(loops):
        # a short private TMPDIR: the fork server's socket lives in it, and AF_UNIX paths stop at 107
        # bytes (an xdist worker's tmp_path is longer)
        tmp = Path(tempfile.mkdtemp(prefix="lk-kill-", dir="/tmp"))
        try:
            results.append(kill_parent_once(tmp))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    assert results == [(set(), [])] * loops


def test_a_dead_worker_costs_only_its_row(project, tmp_path):
    proc = lockstep(["check", "--json", "-j", "2"], tmp_path, cwd=project)
    try:
        first = wait_for(lambda: workers(proc.pid), 30)
        assert first, "no worker started"
        victim = min(first)                          # the first worker spawned holds the first row
        os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    doc = json.loads(out)
    statuses = [s["status"] for s in doc["specs"]]
    assert statuses.count("crash") == 1 and statuses.count("pass") == 2, (statuses, err)
    crash = next(s for s in doc["specs"] if s["status"] == "crash")
    assert "died (signal SIGKILL)" in " ".join(crash["messages"])
    assert proc.returncode == doc["exit_code"] == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(lifeline.PREFIXES)]


@pytest.mark.parametrize("bad", ["0", "-2", "lots", "1.5"])
def test_lockstep_jobs_is_read_as_j_is(monkeypatch, capsys, project, bad):
    monkeypatch.setenv("LOCKSTEP_JOBS", bad)
    assert main(["check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"$LOCKSTEP_JOBS={bad!r}" in err[0]
    monkeypatch.setenv("LOCKSTEP_JOBS", "1")
    assert main(["check"]) == 0


def test_more_jobs_than_cores_says_so(monkeypatch, capsys, project):
    monkeypatch.setattr(check_workers, "cores", lambda: 1)
    assert main(["check", "-j", "2"]) == 0
    assert "note: -j 2 is more than the 1 cores available" in capsys.readouterr().err


def test_sweep_removes_only_dead_runs_folders(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (tmp_path / f"lockstep-launch-{dead}-abc").mkdir()
    (tmp_path / f"lockstep-shared-checkpoints-{dead}-x1").mkdir()
    mine = lifeline.run_folder("lockstep-checkpoints")
    (tmp_path / "lockstep-launch-notapid").mkdir()
    removed = lifeline.sweep()
    assert sorted(Path(p).name for p in removed) == [f"lockstep-launch-{dead}-abc",
                                                     f"lockstep-shared-checkpoints-{dead}-x1"]
    assert Path(mine).is_dir() and (tmp_path / "lockstep-launch-notapid").is_dir()
