"""regen ends with what moved; check --failed and regen --failed act on the last check's failures;
regen -j N records as a serial regen does."""

import json

import lockstep.kernels.coins
from lockstep.harness.cli import main
from tests.conftest import golden_bytes


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def test_regen_says_what_moved(project, capsys, monkeypatch):
    monkeypatch.setattr(lockstep.kernels.coins, "U_DIVISOR", 2**32)       # moves the gumbel floats only
    code, out = run(capsys, "regen", "--dry-run", "coins/known-answers", "coins/gumbel-endpoints")
    assert code == 0, out
    moved = out.split("what moved:\n")[1].split("\n\n")[0]
    assert moved.splitlines() == [
        "  changed coins/gumbel-endpoints (cpu-fp32): tokens unchanged; floats within "
        f"{moved.split('within ')[1].split(' ULP')[0]} ULP (gumbel)"]
    assert int(moved.split("within ")[1].split(" ULP")[0]) > 0
    monkeypatch.setattr(lockstep.kernels.coins, "U_DIVISOR", 2**32 + 1)
    code, out = run(capsys, "regen", "--dry-run", "coins/known-answers")
    assert "what moved" not in out                                          # nothing changed: no section


def test_moved_names_tokens_and_requests():
    import torch

    from lockstep.harness.compare import diff_tensors
    from lockstep.harness.moved import moved

    old = {"tokens_0": torch.tensor([1, 2]), "logprobs_0": torch.tensor([-1.0, -2.0]),
           "tokens_3": torch.tensor([5]), "logprobs_3": torch.tensor([-0.5])}
    new = dict(old, logprobs_0=torch.tensor([-1.0, -2.0000002]), tokens_3=torch.tensor([6]))
    m = moved(old, new, diff_tensors(old, new), {}, {})
    assert m.sentence() == "tokens changed; floats within 1 ULP (logprobs_0); 2 request(s) affected: 0, 3"
    m = moved({}, {}, [], {"tokens": [[1], [2]]}, {"tokens": [[1], [3]]})
    assert m.tokens_changed and m.requests == {1}


def test_check_failed_reruns_only_what_failed(project, capsys, monkeypatch):
    state = project / ".lockstep" / "last-check.json"
    assert run(capsys, "check")[0] == 0 and json.loads(state.read_text())["failed"] == []
    code, out = run(capsys, "check", "--failed")
    assert code == 0 and "failed nothing" in out
    monkeypatch.setattr(lockstep.kernels.coins, "U_DIVISOR", 2**32)
    assert run(capsys, "check", "coins/known-answers", "coins/gumbel-endpoints")[0] == 1
    assert [r["id"] for r in json.loads(state.read_text())["failed"]] == ["coins/gumbel-endpoints"]
    code, out = run(capsys, "check", "--failed")
    assert code == 1 and "1 spec(s): 0 pass, 1 mismatch" in out and "known-answers" not in out
    code, out = run(capsys, "regen", "--failed")
    assert code == 0 and "changed   coins/gumbel-endpoints" in out and "known-answers" not in out
    code, out = run(capsys, "check", "--failed")
    assert code == 0 and "1 spec(s): 1 pass" in out
    assert "failed nothing" in run(capsys, "check", "--failed")[1]


def test_failed_without_an_earlier_check_is_a_usage_error(project, capsys):
    code, out = run(capsys, "regen", "--failed")
    assert code == 2 and "no earlier check recorded" in out


def test_regen_in_two_workers_matches_a_serial_regen(project, capsys, monkeypatch):
    import shutil
    shutil.rmtree(project / "golden")
    code, out = run(capsys, "regen", "-j", "2")
    parallel = golden_bytes(project)
    assert code == 0 and "3 new" in out
    shutil.rmtree(project / "golden")
    assert run(capsys, "regen", "-j", "1")[0] == 0
    serial = golden_bytes(project)
    same = lambda d: {k: v for k, v in d.items() if k.endswith(".safetensors")}     # manifests carry a time
    assert same(parallel) == same(serial) and parallel.keys() == serial.keys()


def test_a_missing_rows_hint_records_the_pair_it_asked_for():
    from lockstep.harness import runner
    from tests.repo_specs import repo_specs

    spec = repo_specs()["generate/top-k"]
    out = runner.Outcome(spec, runner.MISSING, "cpu-fp32-triton", pair="fp32/triton")
    assert "record one with: lockstep regen generate/top-k --dtype fp32 --backend triton" in out.report()
    out = runner.Outcome(spec, runner.MISSING, "cpu-fp32", pair="fp32/torch")
    assert out.report().splitlines()[1].endswith("lockstep regen generate/top-k")
