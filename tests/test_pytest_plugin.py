"""The pytest plugin, run in a scratch project through pytester (a real pytest run)."""

import shutil
import sys

import pytest

from tests.conftest import REPO

SPECS = ("known-answers", "top-hashes-verify")


@pytest.fixture
def scratch(pytester, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    (pytester.path / "specs/coins").mkdir(parents=True)
    for name in SPECS:
        shutil.copy(REPO / f"specs/coins/{name}.yaml", pytester.path / "specs/coins")
    pytester.makeini("[pytest]\ntestpaths = specs\nlockstep_specs = specs\n")
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


# --------------------------------------------------------------------------- --lockstep-target
TOY_ADAPTER = '''
from pathlib import Path

from lockstep.harness.targets import Op, Target
from lockstep.kernels.coins import murmur_hash32_torch, verify_coins


def halved_coins(seeds, seq_lens, n):        # a peer bug, on purpose
    coins, final = verify_coins(seeds, seq_lens, n)
    return coins * 0.5, final


def target():
    return Target("toy", "1.0", ops={"hash": Op(murmur_hash32_torch), "verify_coins": Op(halved_coins)},
                  missing={"gumbel": "toy draws no Gumbel noise"},
                  expectations=str(Path(__file__).with_name("toy-1.0.yaml")))
'''

TOY_EXPECTATIONS = """\
target: toy
version: '1.0'
failures:
  coins/top-hashes-verify:     # fails as recorded: xfailed
    observed: 'coins[0, 0] = 0.3863513171672821 is not the coin of hash column 0 (0.7727026343345642)'
    judgement: peer bug
    why: the toy halves its coins
  coins/divisor:               # fails, but not as recorded
    observed: 'coins[1] = 0.5, the spec expects 1.0'      # another location: floats alone never differ
    judgement: peer bug
    why: the toy halves its coins
  coins/known-answers:         # passes although a failure is expected
    observed: 'hash[0] differs'
    judgement: contract gap
    why: recorded before the toy's hash was fixed
"""


@pytest.fixture
def toy(scratch, monkeypatch):
    """The scratch project with six coin specs, their goldens, and a target `toy` registered through
    the entry point group lockstep.targets (as an engine's own package would)."""
    for name in ("gumbel-endpoints", "wraparound", "divisor", "column-split"):
        shutil.copy(REPO / f"specs/coins/{name}.yaml", scratch.path / "specs/coins")
    scratch.runpytest("--lockstep-regen").assert_outcomes(passed=6)
    dist = scratch.path / "toyengine-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toyengine\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[lockstep.targets]\ntoy = toy_plugin_adapter:target\n")
    (scratch.path / "toy_plugin_adapter.py").write_text(TOY_ADAPTER)
    (scratch.path / "toy-1.0.yaml").write_text(TOY_EXPECTATIONS)
    monkeypatch.syspath_prepend(str(scratch.path))
    monkeypatch.delitem(sys.modules, "toy_plugin_adapter", raising=False)
    return scratch


def test_target_items_are_judged_against_its_expectations(toy):
    result = toy.runpytest("--lockstep-target", "toy", "-rfsx")
    # wraparound passes; gumbel-endpoints is n/a; top-hashes-verify fails as recorded; column-split fails
    # unexpectedly, divisor fails differently, known-answers passes against its expectation
    result.assert_outcomes(passed=1, skipped=1, xfailed=1, failed=3)
    result.stdout.fnmatch_lines_random([
        "SKIPPED [[]1[]] specs/coins/gumbel-endpoints.yaml:1: n/a on toy-1.0: toy draws no Gumbel noise",
        "XFAIL specs/coins/top-hashes-verify.yaml::coins/top-hashes-verify - expected on toy-1.0 (peer bug: the toy "
        "halves its coins): coins[[]0, 0[]] = 0.3863513171672821 is not the coin of hash column 0 *",
        "*NEW FAILURE coins/column-split: coins[[]0, 0[]] = 0.3292679190635681 is not the coin of hash column 0*",
        "*FAILS DIFFERENTLY coins/divisor: coins[[]0[]] = 0.019290266558527946, the spec expects 0.03858053311705589",
        "*expected: coins[[]1[]] = 0.5, the spec expects 1.0",
        "*EXPECTED FAILURE now passes: coins/known-answers (remove it from the expectations)",
        "FAILED specs/coins/column-split.yaml::coins/column-split*",
        "FAILED specs/coins/divisor.yaml::coins/divisor*",
        "FAILED specs/coins/known-answers.yaml::coins/known-answers*",
    ])
    # `lockstep check --target toy` gives the same judgement
    from lockstep.harness.cli import main
    assert main(["check", "--target", "toy", "--device", "cpu"]) == 1


def test_target_matching_its_expectations_is_green(toy):
    exp = toy.path / "toy-1.0.yaml"
    exp.write_text(TOY_EXPECTATIONS.split("  coins/divisor:")[0])      # top-hashes-verify only
    result = toy.runpytest("--lockstep-target", "toy", "-k", "top-hashes or wraparound or gumbel")
    result.assert_outcomes(passed=1, skipped=1, xfailed=1, deselected=3)
    assert result.ret == 0


def test_target_that_cannot_load_or_whose_expectations_are_stale_is_a_usage_error(toy):
    result = toy.runpytest("--lockstep-target", "no-such-engine")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*unknown target 'no-such-engine'; known: lockstep, sglang, vllm, hf, toy*"])
    (toy.path / "specs/coins/divisor.yaml").unlink()       # an expectation of a spec not here: warned, not fatal
    result = toy.runpytest("--lockstep-target", "toy", "-k", "wraparound")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["*its expectations name specs that are in no spec directory of this run: "
                                 "coins/divisor*"])
    (toy.path / "bad.yaml").write_text(TOY_EXPECTATIONS.replace("peer bug", "peer bugg", 1))
    result = toy.runpytest("--lockstep-target", "toy", "--lockstep-expectations", str(toy.path / "bad.yaml"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*bad.yaml:*: judgement 'peer bugg' is not one of peer bug, contract gap, unjudged*"])
    result = toy.runpytest("--lockstep-target", "toy", "--lockstep-regen")
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_a_yml_file_is_a_failing_item_not_skipped(scratch):
    scratch.runpytest("--lockstep-regen")
    shutil.copy(scratch.path / "specs/coins/known-answers.yaml", scratch.path / "specs/coins/copy.yml")
    result = scratch.runpytest()
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*specs/coins/copy.yml: spec files end in .yaml: this file would be ignored*"])


def test_regen_refused_while_another_regen_holds_the_goldens(scratch):
    from lockstep.harness.golden import GoldenStore

    with GoldenStore(scratch.path / "golden").writer_lock():
        result = scratch.runpytest("--lockstep-regen")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*another process is recording goldens*"])


# --------------------------------------------------------------------------- lockstep_slow (issue 38)
def test_slow_specs_are_marked_by_the_ini_list_and_still_run_by_default(scratch):
    """Two gates, one truth: `-m "not slow"` leaves out the listed specs, `-m slow` runs only them,
    and a plain run runs every spec; the list lives in the ini file (a spec's tags are hashed into
    its goldens). A glob naming no spec is warned about."""
    scratch.runpytest("--lockstep-regen").assert_outcomes(passed=2)
    scratch.makeini("[pytest]\ntestpaths = specs\nlockstep_specs = specs\nlockstep_slow =\n    coins/top-*  # the costly one\n"
                    "    coins/no-such-spec\n")
    quick = scratch.runpytest("-m", "not slow", "-rA")
    quick.assert_outcomes(passed=1, deselected=1)
    quick.stdout.fnmatch_lines(["*lockstep_slow: these globs name no spec: coins/no-such-spec*",
                                "PASSED specs/coins/known-answers.yaml::coins/known-answers*"])
    scheduled = scratch.runpytest("-m", "slow", "-rA")
    scheduled.assert_outcomes(passed=1, deselected=1)
    scheduled.stdout.fnmatch_lines(["PASSED specs/coins/top-hashes-verify.yaml::coins/top-hashes-verify*"])
    scratch.runpytest().assert_outcomes(passed=2)


def test_the_projects_slow_list_names_only_specs_that_exist():
    """Every glob of this project's own lockstep_slow names a spec (a renamed spec would otherwise
    slip into the quick gate unnoticed), and the quick gate still holds most specs."""
    import tomllib
    from fnmatch import fnmatchcase

    from lockstep.harness.specfile import spec_files, spec_id_for

    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    globs = [g.split("#")[0].strip() for g in ini["lockstep_slow"]]
    ids = {spec_id_for(f, REPO / "specs") for f in spec_files(REPO / "specs")}
    assert [g for g in globs if g and not any(fnmatchcase(i, g) for i in ids)] == []
    slow = {i for i in ids if any(fnmatchcase(i, g) for g in globs if g)}
    assert slow and len(slow) * 5 < len(ids)


@pytest.mark.parametrize("make,words", [
    (lambda p: p.symlink_to(p.parent / "nowhere.yaml"), "a broken symbolic link: it cannot be read as a spec"),
    (lambda p: p.symlink_to("/dev/zero"), "not a regular file: it cannot be read as a spec"),
    (lambda p: __import__("os").mkfifo(p), "not a regular file: it cannot be read as a spec"),
])
def test_an_unreadable_spec_file_is_a_failing_item_as_in_the_cli(scratch, make, words):
    scratch.runpytest("--lockstep-regen")
    make(scratch.path / "specs/coins/odd.yaml")
    result = scratch.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([f"*{words}*", "FAILED specs/coins/odd.yaml*"])
