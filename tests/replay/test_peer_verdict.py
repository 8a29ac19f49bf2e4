"""import-peer is a verdict: exit 0 / 1 / 2 as replay, `ok` and `schema_version` in its JSON, and
the same numbers as replay for the same data (one delta computation, harness/replay/deltas.py);
its RL statistics (|Δ|, KL k1/k3, importance ratios) are right on a known perturbation."""

import json
import math

import jsonschema
import pytest

from lockstep.harness.cli import main
from lockstep.harness.replay.deltas import rl_stats
from lockstep.harness.replay.format import f32_from_bits, read_trace
from tests.conftest import REPO

TARGET = "models/tiny-target"


def validator(name):
    return jsonschema.Draft202012Validator(json.loads((REPO / "docs/schemas" / f"{name}.schema.json").read_text()))


@pytest.fixture(scope="module")
def own_rollouts(tmp_path_factory):
    """[(prompt, tokens, logprobs)] from Lockstep's own recording: a peer that agrees bitwise."""
    d = tmp_path_factory.mktemp("own")
    assert main(["record", str(d / "t.jsonl"), "--checkpoint", TARGET, "--prompt-ids", "1,2,3",
                 "--prompt-ids", "9,8", "--seed", "5", "--max-new-tokens", "5"]) == 0
    trace = read_trace(d / "t.jsonl")
    return [(r["prompt"], [s["token"] for s in steps], [f32_from_bits(s["logprob_bits"]) for s in steps])
            for r, steps in zip(trace.requests, trace.steps)]


def write(tmp_path, rollouts, shift=lambda i, k, lp: lp):
    path = tmp_path / "peer.jsonl"
    path.write_text("".join(json.dumps({"prompt_ids": p, "response_ids": t,
                                        "logprobs": [shift(i, k, lp) for k, lp in enumerate(lps)]}) + "\n"
                            for i, (p, t, lps) in enumerate(rollouts)))
    return path


def peer(capsys, path, *more):
    code = main(["import-peer", str(path), "--format", "rollouts", "--checkpoint", TARGET, "--json", *more])
    return code, json.loads(capsys.readouterr().out)


def test_an_agreeing_peer_exits_0(tmp_path, own_rollouts, capsys):
    code, doc = peer(capsys, write(tmp_path, own_rollouts))
    assert code == 0 and doc["ok"] is True and doc["schema_version"] == 1
    assert not list(validator("import-peer").iter_errors(doc))
    assert doc["stats"]["max"] == 0.0 and doc["stats"]["rl"]["kl_k3"] == 0.0 and doc["stats"]["rl"]["outside_clip"] == 0


def test_a_departing_peer_exits_1_and_replay_reports_the_same_numbers(tmp_path, own_rollouts, capsys):
    path = write(tmp_path, own_rollouts, lambda i, k, lp: lp + (0.25 if (i, k) == (1, 3) else 1e-6))
    code, doc = peer(capsys, path, "--out", str(tmp_path / "p.jsonl"))
    assert code == 1 and doc["ok"] is False and doc["first_off"] == {"1": 3}
    assert not list(validator("import-peer").iter_errors(doc))
    code = main(["replay", str(tmp_path / "p.jsonl"), "--mode", "teacher-forced", "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 1 and rep["ok"] is False and not list(validator("replay").iter_errors(rep))
    for key in ("p50", "p95", "max", "mean", "share_over_threshold", "bitwise_equal"):
        assert rep["stats"][key] == doc["stats"][key], key          # one computation: the very same floats
    assert rep["stats"]["rl"] == doc["stats"]["rl"] and rep["stats"]["per_request"] == doc["per_request"]


def test_text_report_says_the_verdict(tmp_path, own_rollouts, capsys):
    path = write(tmp_path, own_rollouts, lambda i, k, lp: lp - 0.5 if k == 0 else lp)
    assert main(["import-peer", str(path), "--format", "rollouts", "--checkpoint", TARGET]) == 1
    out = capsys.readouterr().out
    assert "DIVERGED: 2 request(s)" in out and "KL(trace‖lockstep) k1" in out


def test_rl_statistics_on_a_known_shift():
    # lockstep is 0.1 nats above the trace on every token: ratio e^0.1, k1 = -0.1, k3 = e^0.1 - 1 - 0.1
    pairs = [(-1.0, -1.1), (-2.0, -2.1), (-0.5, -0.6), (-3.0, -3.1)]
    s = rl_stats(pairs, clip=0.2)
    assert s["kl_k1"] == pytest.approx(-0.1) and s["kl_k3"] == pytest.approx(math.exp(0.1) - 1.1)
    assert s["ratio_min"] == pytest.approx(math.exp(0.1)) and s["outside_clip"] == 0.0
    assert rl_stats(pairs, clip=0.1)["outside_clip"] == 1.0                 # e^0.1 = 1.105 > 1.1
    assert rl_stats([(-1.0, float("-inf"))], 0.2)["ratio_max"] == math.inf
