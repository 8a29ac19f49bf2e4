"""The pytest plugin, run in a scratch project through pytester (a real pytest run)."""

import shutil

import pytest

from tests.conftest import REPO

SPECS = ("known-answers", "top-hashes-verify")


@pytest.fixture
def scratch(pytester, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    (pytester.path / "specs/coins").mkdir(parents=True)
    for name in SPECS:
        shutil.copy(REPO / f"specs/coins/{name}.yaml", pytester.path / "specs/coins")
    pytester.makeini("[pytest]\ntestpaths = specs\n")
    return pytester


def test_collects_one_item_per_spec_named_by_id(scratch):
    result = scratch.runpytest("--collect-only", "-q")
    result.stdout.fnmatch_lines(["specs/coins/known-answers.yaml::coins/known-answers",
                                 "specs/coins/top-hashes-verify.yaml::coins/top-hashes-verify"])


def test_missing_goldens_fail_then_regen_then_pass(scratch):
    result = scratch.runpytest()
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*MISSING*", "*lockstep regen coins/known-answers*"])
    scratch.runpytest("--lockstep-regen").assert_outcomes(passed=2)
    assert (scratch.path / "golden/shared/coins/known-answers.safetensors").exists()
    scratch.runpytest().assert_outcomes(passed=2)


def test_failure_text_is_the_mismatch_report_located_at_the_yaml(scratch):
    scratch.runpytest("--lockstep-regen").assert_outcomes(passed=2)
    spec = scratch.path / "specs/coins/top-hashes-verify.yaml"
    spec.write_text(spec.read_text().replace("draft_token_num: 7", "draft_token_num: 6"))
    result = scratch.runpytest("-k", "top-hashes")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["*tensor 'coins': shape differs: golden [[]9, 7[]], got [[]9, 6[]]*",
                                 "*golden may be stale: it was recorded for another version of this spec*",
                                 "FAILED specs/coins/top-hashes-verify.yaml::coins/top-hashes-verify*"])


def test_bad_spec_is_a_located_failure_and_others_run(scratch):
    scratch.runpytest("--lockstep-regen")
    (scratch.path / "specs/coins/bad.yaml").write_text("kind: coins\ndescription: x\ninputs:\n  seeds: [1, x]\n")
    result = scratch.runpytest()
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["  specs/coins/bad.yaml:4:14: inputs.seeds[[]1[]]: expected an integer (int64), found str *x*",
                                 "FAILED specs/coins/bad.yaml::coins/bad*"])


def test_regen_refused_under_ci(scratch, monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = scratch.runpytest("--lockstep-regen")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*CI=true*"])


def test_works_under_xdist(scratch):
    scratch.runpytest("--lockstep-regen")
    result = scratch.runpytest_subprocess("-n", "2")
    result.assert_outcomes(passed=2)


def test_a_yml_file_is_a_failing_item_not_skipped(scratch):
    scratch.runpytest("--lockstep-regen")
    shutil.copy(scratch.path / "specs/coins/known-answers.yaml", scratch.path / "specs/coins/copy.yml")
    result = scratch.runpytest()
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*specs/coins/copy.yml: spec files end in .yaml: this file would be ignored*"])


def test_regen_refused_while_another_regen_holds_the_goldens(scratch):
    from harness.golden import GoldenStore

    with GoldenStore(scratch.path / "golden").writer_lock():
        result = scratch.runpytest("--lockstep-regen")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*another process is recording goldens*"])
