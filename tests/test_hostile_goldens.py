"""Hostile goldens (issue 14): a golden that is a folder, or whose manifest names another spec or
platform, is corrupt (exit 1), never a traceback or a pass; goldens are written with the umask's modes."""

import os
import shutil
import stat

import pytest

from lockstep.harness.cli import main
from lockstep.harness.golden import GoldenLocked, GoldenStore


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_golden_path_that_is_a_directory_is_corrupt(project, capsys):
    path = project / "golden/shared/coins/known-answers.safetensors"
    path.unlink()
    path.mkdir()
    code, out = run(capsys, "check", "coins/known-answers")
    assert code == 1 and "CORRUPT" in out and "known-answers.safetensors: not a regular file" in out
    code, out = run(capsys, "regen", "coins/known-answers")      # regen cannot replace a folder either
    assert code == 1 and "cannot write the golden" in out and "Traceback" not in out


@pytest.mark.parametrize("field,value", [("spec", "coins/gumbel-endpoints"), ("platform", "cpu-fp32")])
def test_a_manifest_naming_another_spec_or_platform_is_corrupt(project, capsys, field, value):
    store = GoldenStore(project / "golden")
    tpath, mpath = store.paths("shared", "coins/known-answers")
    manifest = mpath.read_text().replace('"spec": "coins/known-answers"', f'"spec": "{value}"') if field == "spec" \
        else mpath.read_text().replace('"platform": "shared"', f'"platform": "{value}"')
    mpath.write_text(manifest)
    code, out = run(capsys, "check", "coins/known-answers")
    assert code == 1 and f"the manifest names {field} '{value}'" in out


def test_goldens_honour_the_umask(project, capsys):
    shutil.rmtree(project / "golden")
    old = os.umask(0o027)
    try:
        assert run(capsys, "regen", "coins/known-answers")[0] == 0
    finally:
        os.umask(old)
    for f in (project / "golden/shared/coins").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o640, f


def test_a_stale_spec_hash_passes_with_a_warning_and_fails_when_strict(project):
    from lockstep.harness import runner
    from lockstep.harness.platform import detect
    from lockstep.harness.result import RunContext
    from lockstep.harness.specfile import load_spec_file

    spec_file = project / "specs/coins/known-answers.yaml"
    spec_file.write_text(spec_file.read_text().replace("tags: [", "tags: [edited, "))
    spec = load_spec_file(spec_file, project / "specs")
    ctx, store = RunContext(detect("cpu")), GoldenStore(project / "golden")
    lenient, strict = runner.check_spec(spec, ctx, store), runner.check_spec(spec, ctx, store, strict=True)
    assert lenient.status == runner.PASS and lenient.stale_golden and "golden may be stale" in lenient.report()
    assert strict.status == runner.STALE and strict.status in runner.FAILING


def test_writer_locks_conflict_across_holders(tmp_path):
    store = GoldenStore(tmp_path / "golden")
    with store.writer_lock():
        for shared in (False, True):
            with pytest.raises(GoldenLocked), store.writer_lock(shared=shared):
                pass
    with store.writer_lock(shared=True), store.writer_lock(shared=True):   # the plugin's xdist workers
        with pytest.raises(GoldenLocked), store.writer_lock():
            pass
    assert list((tmp_path / "golden").iterdir()) == []                     # no lock file left behind


# --------------------------------------------------------------------------- issue 29: no debris from a signal
def test_a_stale_temporary_file_fails_check_strict_and_regen_removes_it(project, capsys):
    debris = project / "golden/shared/coins/known-answers.json.abc123.tmp-lockstep"
    debris.write_text("{half a manif")                     # what a kill -9 during a write leaves
    code, out = run(capsys, "check")
    assert code == 0 and "1 stale temporary file(s)" in out and str(debris.relative_to(project)) in out
    code, out = run(capsys, "check", "--strict")
    assert code == 1 and "1 stale temporary file(s)" in out and "failing under --strict" in out
    code, out = run(capsys, "regen", "--dry-run")
    assert code == 0 and "would remove stale temporary file" in out and debris.exists()
    code, out = run(capsys, "regen")
    assert code == 0 and "removed stale temporary file" in out and not debris.exists()
    assert run(capsys, "check", "--strict")[0] == 0


# `lockstep regen` on a slow disk (every fsync takes 40 ms, which widens the moments a temporary
# file exists: on a fast disk they last microseconds), that may also SIGTERM itself during its
# fsync number K (argv[1]; 0: never), i.e. at a moment a temporary file certainly exists.
SLOW_DISK_REGEN = """\
import os, signal, sys, time
real, calls, at = os.fsync, [0], int(sys.argv[1])
def fsync(fd):
    calls[0] += 1
    time.sleep(0.04)
    if calls[0] == at:
        os.kill(os.getpid(), signal.SIGTERM)
    return real(fd)
os.fsync = fsync
from lockstep.harness.cli import main
sys.exit(main(['regen', '--device', 'cpu']))
"""


def test_sigterm_at_any_moment_of_a_regen_leaves_no_temporary_file(project):
    """SIGTERM a regen that writes many goldens, at varied moments (during the K-th fsync of its
    writes, and at delays spread over its run): wherever it lands, no `*.tmp-lockstep` file is left
    (signals are deferred from before a temporary file is created until it is renamed), and every
    golden on disk is whole. The regens are forked from one process that imported the harness
    (tests/forking.py), so a run is the regen itself, not mostly torch's import."""
    import signal
    import time

    from tests.conftest import REPO
    from tests.forking import Forker

    source = (project / "specs/coins/known-answers.yaml").read_text()
    for i in range(8):                                    # cheap specs: their writes fill most of the run
        (project / f"specs/coins/copy-{i:02d}.yaml").write_text(source)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("CI", None)
    store = GoldenStore(project / "golden")

    def regen(at: int, delay: float | None = None) -> int:
        shutil.rmtree(project / "golden", ignore_errors=True)
        proc = forker.start(SLOW_DISK_REGEN, [at], cwd=project, env=env)
        if delay is not None:
            time.sleep(delay)
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        assert store.stale_temps() == [], (at, delay)
        for platform, ids in store.ids().items():          # what was written is whole: loads, not corrupt
            for spec_id in ids:
                assert store.load(platform, spec_id) is not None
        return code

    with Forker(["lockstep.harness.cli", "lockstep.harness.runner", "lockstep.harness.kinds"], env=env) as forker:
        for at in (1, 2, 5, 13):                    # inside the first golden's write, then later ones
            assert regen(at) == -signal.SIGTERM, at
        start = time.perf_counter()
        assert regen(0) == 0
        whole = time.perf_counter() - start
        killed = sum(regen(0, whole * f) == -signal.SIGTERM for f in (0.6, 0.8))
    assert killed >= 1                                     # a timed signal landed while it ran
