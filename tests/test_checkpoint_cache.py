"""The synthetic-checkpoint cache shared by one run's processes (harness/checkpoints.py, issue 38):
each folder is made once, appears whole (atomic rename), is never replaced while others read it, and
holds the bits a private make_checkpoint gives."""

import os
import subprocess
import sys

import pytest

from lockstep.harness import checkpoints
from lockstep.harness.checkpoints import SHARED_ENV, _cached
from tests.conftest import REPO


def _writer(calls: list):
    def build(out):
        calls.append(out)
        out.mkdir(parents=True)
        (out / "weights").write_text(f"made by call {len(calls)}")
        return out
    return build


def test_a_shared_folder_is_made_once_and_never_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv(SHARED_ENV, str(tmp_path))
    calls = []
    first = _cached("tiny-s0-bf16", _writer(calls))
    again = _cached("tiny-s0-bf16", _writer(calls))
    assert first == again == tmp_path / "tiny-s0-bf16" and len(calls) == 1
    assert (first / "weights").read_text() == "made by call 1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-s0-bf16"]        # no staging left


def test_the_loser_of_a_race_reads_the_winners_folder(tmp_path, monkeypatch):
    """Another process renames its copy into place while this one builds: this one's copy is
    dropped, the winner's is kept as it is (a reader of it is never disturbed)."""
    monkeypatch.setenv(SHARED_ENV, str(tmp_path))
    winner = _writer([])

    def build_while_another_wins(out):
        winner(tmp_path / "d")
        (tmp_path / "d" / "weights").write_text("the winner's")
        return _writer([])(out)
    assert _cached("d", build_while_another_wins) == tmp_path / "d"
    assert (tmp_path / "d" / "weights").read_text() == "the winner's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_a_failed_build_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setenv(SHARED_ENV, str(tmp_path))

    def broken(out):
        out.mkdir(parents=True)
        raise OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        _cached("x", broken)
    assert list(tmp_path.iterdir()) == []


def test_without_the_variable_the_cache_is_the_process_own(tmp_path, monkeypatch):
    monkeypatch.delenv(SHARED_ENV, raising=False)
    calls = []
    out = _cached("private-probe", _writer(calls))
    assert out.parent == checkpoints._cache_root() and calls == [out]


PROBE = """
import sys
from lockstep.harness.checkpoints import checkpoint_dir
from lockstep.engine.checkpoint import checkpoint_digest
d = checkpoint_dir("tiny", 3, "mxfp4")
print(d, sorted(checkpoint_digest(d).items()))
"""


def test_two_processes_share_one_checkpoint_with_the_private_bits(tmp_path):
    """Two processes of one run get the same folder; its files are those make_checkpoint writes
    for a private folder."""
    from lockstep.engine.checkpoint import checkpoint_digest, make_checkpoint

    env = {**os.environ, SHARED_ENV: str(tmp_path / "shared"), "PYTHONPATH": str(REPO)}
    (tmp_path / "shared").mkdir()
    outs = [subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=REPO, capture_output=True, text=True,
                           timeout=600) for _ in range(2)]
    assert all(o.returncode == 0 for o in outs), [o.stderr[-2000:] for o in outs]
    assert outs[0].stdout == outs[1].stdout
    assert outs[0].stdout.startswith(str(tmp_path / "shared" / "tiny-s3-mxfp4") + " ")
    private = make_checkpoint("tiny", 3, "mxfp4", tmp_path / "private")
    assert outs[0].stdout.split(" ", 1)[1].strip() == str(sorted(checkpoint_digest(private).items()))
