"""Hostile goldens (issue 14): a golden that is a folder, or whose manifest names another spec or
platform, is corrupt (exit 1), never a traceback or a pass; goldens are written with the umask's modes."""

import os
import shutil
import stat

import pytest

from harness.cli import main
from harness.golden import GoldenLocked, GoldenStore


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
    from harness import runner
    from harness.platform import detect
    from harness.result import RunContext
    from harness.specfile import load_spec_file

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
