"""`lockstep` end to end on a scratch project: exit codes, reports, regen safety."""

import json
import shutil

import pytest
import torch

import lockstep.kernels.coins
from lockstep.harness.cli import main
from lockstep.harness.golden import GoldenStore
from tests.conftest import REPO, golden_bytes


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_check_passes_on_recorded_goldens(project, capsys):
    code, out = run(capsys, "check")
    assert code == 0 and "3 spec(s): 3 pass in " in out and "run on cpu-fp32" in out
    assert "goldens: golden/cpu-fp32 (1), golden/shared (2)" in out


def test_json_output(project, capsys):
    code = main(["check", "--json"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # stdout holds the JSON document only
    assert captured.err.count("\n") == 3 and "[3/3] pass" in captured.err  # a line per spec for a CI log
    assert code == report["exit_code"] == 0
    assert [s["status"] for s in report["specs"]] == ["pass"] * 3
    assert {s["golden_platform"] for s in report["specs"]} == {"shared", "cpu-fp32"}


def test_missing_golden_exits_3(project, capsys):
    shutil.copy(REPO / "specs/coins/divisor.yaml", project / "specs/coins/new.yaml")
    code, out = run(capsys, "check")
    assert code == 3 and "MISSING" in out and "lockstep regen coins/new" in out


def test_spec_error_exits_2_and_others_still_run(project, capsys):
    (project / "specs/coins/broken.yaml").write_text("kind: coins\ndescription: x\ninputs: {seeds: [1]}\n")
    code, out = run(capsys, "check")
    assert code == 2 and "specs/coins/broken.yaml:3:" in out and "3 pass" in out


def test_unknown_pattern_is_a_usage_error(project, capsys):
    code, out = run(capsys, "check", "nope/*")
    assert code == 2 and "no spec matches 'nope/*'" in out
    assert run(capsys, "check", "--no-such-flag")[0] == 2


def test_selection_by_glob_and_tag(project, capsys):
    code, out = run(capsys, "check", "coins/known-*")
    assert code == 0 and "1 spec(s)" in out
    code, out = run(capsys, "check", "--tag", "gumbel")
    assert code == 0 and "coins/gumbel-endpoints" in out and "1 spec(s)" in out


@pytest.mark.parametrize("bug", ["no_clamp", "divide_by_2_32"])
def test_a_wrong_coin_turns_check_red_at_the_right_column(project, capsys, monkeypatch, bug):
    if bug == "no_clamp":
        monkeypatch.setattr(lockstep.kernels.coins, "COIN_MAX", 1.0)
    else:
        monkeypatch.setattr(lockstep.kernels.coins, "U_DIVISOR", 2**32)
    code, out = run(capsys, "check")
    assert code == 1 and "MISMATCH  coins/top-hashes-verify" in out
    if bug == "no_clamp":
        # rows 1 and 3 hold top hashes in columns 6 and 0; row 0 has one in the final column (N = 7)
        assert "first difference at flat index 13 = [1, 6]" in out and "got 1.0 (0x3f800000)" in out
        assert "columns (last dim) that differ: [0, 1, 4, 6]" in out
    else:
        assert "first difference at flat index 19 = [2, 5]" in out
    assert "reproduce: lockstep diff coins/top-hashes-verify" in out


def test_corrupt_golden_exits_1_and_is_untouched(project, capsys):
    path = project / "golden/shared/coins/known-answers.safetensors"
    path.write_bytes(path.read_bytes()[:-3])
    before = golden_bytes(project)
    code, out = run(capsys, "check")
    assert code == 1 and "CORRUPT" in out and "truncated or edited" in out
    assert golden_bytes(project) == before


def test_stale_golden_reported_and_strict_fails(project, capsys):
    (project / "specs/coins/known-answers.yaml").unlink()
    code, out = run(capsys, "check")
    assert code == 0 and "golden/shared/coins/known-answers" in out
    code, out = run(capsys, "check", "--strict")
    assert code == 1


def test_diff_explains_a_passing_spec(project, capsys):
    code, out = run(capsys, "diff", "coins/known-answers")
    assert code == 0 and "identical to the golden, bit for bit" in out and "hash: int64 [7]" in out


def test_regen_round_trip_is_byte_identical(project, capsys):
    before = golden_bytes(project)
    code, out = run(capsys, "regen")
    assert code == 0 and "3 unchanged" in out and golden_bytes(project) == before


def test_regen_refuses_under_ci_unless_allowed(project, capsys, monkeypatch):
    monkeypatch.setenv("CI", "true")
    shutil.rmtree(project / "golden")
    code, out = run(capsys, "regen")
    assert code == 2 and "CI=true" in out and not (project / "golden").exists()
    assert run(capsys, "regen", "--allow-ci")[0] == 0


def test_regen_shows_changes_and_touches_only_the_selection(project, capsys, monkeypatch):
    monkeypatch.setattr(lockstep.kernels.coins, "COIN_MAX", 0.5)  # a deliberate contract change
    before = golden_bytes(project)
    code, out = run(capsys, "regen", "--dry-run", "coins/top-hashes-verify")
    assert code == 1 and "refused" in out  # its own expectation (column_split) now fails
    monkeypatch.setattr(lockstep.kernels.coins, "COIN_MAX", 1.0 - 2.0**-24)
    monkeypatch.setattr(lockstep.kernels.coins, "U_DIVISOR", 2**32)
    code, out = run(capsys, "regen", "--dry-run", "coins/known-answers", "coins/gumbel-endpoints")
    assert code == 0 and "unchanged coins/known-answers" in out and "changed   coins/gumbel-endpoints" in out
    assert "tensor 'gumbel'" in out and "would write 1" in out and golden_bytes(project) == before
    code, out = run(capsys, "regen", "coins/gumbel-endpoints")
    after = golden_bytes(project)
    changed = {k for k in after if after[k] != before[k]}
    assert code == 0 and changed == {"golden/cpu-fp32/coins/gumbel-endpoints.json",
                                     "golden/cpu-fp32/coins/gumbel-endpoints.safetensors"}


def test_regen_refuses_when_two_runs_disagree(project, capsys, monkeypatch):
    calls = iter(range(100))
    real = lockstep.kernels.coins.gumbel_from_hash
    monkeypatch.setattr("lockstep.harness.targets.lockstep_run.gumbel_from_hash", lambda h: real(h) + next(calls))
    before = golden_bytes(project)
    code, out = run(capsys, "regen", "coins/gumbel-endpoints")
    assert code == 1 and "two runs disagree" in out and golden_bytes(project) == before


def test_crash_in_runner_is_reported_not_raised(project, capsys, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("kernel exploded")

    monkeypatch.setattr("lockstep.harness.targets.lockstep_run.MURMUR", {"torch": boom, "triton": boom})
    code, out = run(capsys, "check", "coins/known-answers")
    assert code == 1 and "CRASH" in out and "kernel exploded" in out


def test_list_and_validate(project, capsys):
    code, out = run(capsys, "list")
    assert code == 0 and "coins/known-answers" in out and "coins " in out
    code, out = run(capsys, "validate")
    assert code == 0 and "3 spec(s) valid, 0 invalid" in out
    (project / "specs/coins/bad.yaml").write_text("kind: coins\ndescriptoin: x\n")
    code, out = run(capsys, "validate")
    assert code == 2 and "did you mean 'description'" in out


def test_missing_spec_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out = run(capsys, "check")
    assert code == 2 and "no spec directory" in out


def test_world_size_runs_each_split_once_as_its_help_says(capsys):
    """`--world-size W` adds (tp=W, ep=1) and (tp=1, ep=W) per W, never tp=W x ep=W; 1 adds none;
    a split the model cannot take is named, not run. The help says the same."""
    from lockstep.engine.config import preset
    from lockstep.engine.parallel import plan_splits

    ran, skipped, _ = plan_splits(preset("tiny"), [], (1, 2, 4), "cpu")
    assert ran == [(2, 1), (1, 2), (1, 4)]
    assert skipped == ["tp=4 ep=1: tp=4 must divide num_key_value_heads=2 (unsupported split)"]
    assert main(["check", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "once tensor parallel (tp=W ep=1) and once expert parallel (tp=1 ep=W)" in text
    assert "(1 adds no run)" in text


def test_world_size_says_which_splits_ran_and_which_did_not(capsys, monkeypatch):
    """The text report under --world-size sums up each split's runs and the splits left out."""
    monkeypatch.chdir(REPO)
    code, out = run(capsys, "check", "--world-size", "2,4", "--dtype", "fp32", "--backend", "torch",
                    "generate/greedy-tiny-bf16")
    assert code == 0, out
    assert "--world-size 2,4: tp=2 ep=1 on 1 spec(s); tp=1 ep=2 on 1 spec(s); tp=1 ep=4 on 1 spec(s)" in out, out
    assert "not run at tp=4 ep=1: tp=4 must divide num_key_value_heads=2 (unsupported split) (1 spec(s))" in out
    code, out = run(capsys, "check", "--dtype", "fp32", "--backend", "torch", "generate/greedy-tiny-bf16")
    assert "--world-size" not in out
