"""An imported peer rollout promoted to a teacher-forced `replay` spec: the spec validates, regen
records Lockstep's teacher-forced logprobs, check passes, a mutated engine fails it; a tampered
trace, a spec of bad peer values and a trace of another checkpoint are refused."""

from __future__ import annotations

import json

import pytest
import yaml

import lockstep.kernels.attention
from lockstep.engine.generate import Request
from lockstep.engine.sampling import SamplingParams
from lockstep.harness.cli import main
from lockstep.harness.replay.format import TraceError, f32_from_bits, read_trace
from lockstep.harness.replay.peer import import_peer
from lockstep.harness.replay.promote import promote
from lockstep.harness.replay.record import record
from lockstep.harness.replay.run import Setup
from lockstep.harness.specfile import SpecErrors, parse_spec

PRESET = {"preset": "tiny", "seed": 0, "format": "bf16"}    # synthetic: a scratch project needs no folder
PROMPTS = [list(range(30, 40)), [4, 8, 15, 16, 23, 42]]


@pytest.fixture(scope="module")
def peer_trace(tmp_path_factory):
    """A peer rollout file (Lockstep's own greedy run with two logprobs moved, as another engine's
    would differ: 0.25 at request 1 step 2, over the threshold; 1e-5 at request 0 step 1, within),
    imported as a trace and written with import-peer's --out."""
    tmp = tmp_path_factory.mktemp("peer")
    ref = record(Setup(PRESET), [Request(p, SamplingParams(greedy=True, max_new_tokens=4, stop_token_ids=()))
                                 for p in PROMPTS])
    lines = []
    for i, (req, steps) in enumerate(zip(ref.requests, ref.steps)):
        lps = [f32_from_bits(s["logprob_bits"]) for s in steps]
        lps[1] += 1e-5 if i == 0 else 0.0
        lps[2] -= 0.25 if i == 1 else 0.0
        lines.append(json.dumps({"prompt_ids": req["prompt"], "response_ids": [s["token"] for s in steps],
                                 "logprobs": lps}))
    rollouts = tmp / "rollouts.jsonl"
    rollouts.write_text("\n".join(lines) + "\n")
    from lockstep.harness.replay.format import write_trace
    return write_trace(import_peer(rollouts, "rollouts", PRESET), tmp / "peer.jsonl")


def test_peer_rollout_promoted_is_guarded_by_check(tmp_path, peer_trace, monkeypatch, capsys):
    monkeypatch.delenv("CI", raising=False)
    specs, golden = tmp_path / "specs", tmp_path / "golden"
    assert main(["promote", str(peer_trace), "replay/rl-incident", "--specs", str(specs)]) == 0
    out = capsys.readouterr().out
    assert f"lockstep regen --specs {specs} replay/rl-incident" in out     # the hint names the flags it needs
    doc = yaml.safe_load((specs / "replay" / "rl-incident.yaml").read_text())
    t = read_trace(peer_trace)
    assert doc["kind"] == "replay" and doc["inputs"]["mode"] == "teacher-forced"
    assert doc["inputs"]["peer"]["tokens"] == [[s["token"] for s in steps] for steps in t.steps]
    assert doc["inputs"]["peer"]["logprob_bits"] == [[s["logprob_bits"] for s in steps] for steps in t.steps]
    # the verdict the promoted spec pins: the 0.25 over the threshold is the first divergence, 1e-5 is within
    assert doc["expect"]["ok"] is False
    assert doc["expect"]["first"] == {"request": 1, "step": 2, "status": "bits"}
    dirs = ["--specs", str(specs), "--golden", str(golden)]
    assert main(["validate", "--specs", str(specs)]) == 0
    assert main(["regen", *dirs, "replay/*"]) == 0
    assert main(["check", *dirs, "replay/*"]) == 0
    capsys.readouterr()

    attend = lockstep.kernels.attention._attend

    def mutated(*args, **kwargs):                  # the reference's attention, a little off: its logprobs move
        return attend(*args, **kwargs) * (1 + 2 ** -12)
    monkeypatch.setattr(lockstep.kernels.attention, "_attend", mutated)
    assert main(["check", *dirs, "replay/*"]) == 1


def test_a_tampered_trace_is_refused(tmp_path, peer_trace, capsys):
    lines = peer_trace.read_text().splitlines()
    step = next(n for n, line in enumerate(lines) if '"kind":"step"' in line)
    rec = json.loads(lines[step])
    rec["logprob_bits"] = "bf800000"                          # one step's logprob edited by hand
    lines[step] = json.dumps(rec, sort_keys=True, separators=(",", ":"))
    bad = tmp_path / "tampered.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    assert main(["promote", str(bad), "replay/x", "--specs", str(tmp_path / "specs")]) == 2
    err = capsys.readouterr().err
    assert "hash" in err and "Traceback" not in err
    assert not (tmp_path / "specs" / "replay" / "x.yaml").exists()


def test_a_trace_of_another_checkpoint_is_refused(tmp_path, peer_trace):
    t = read_trace(peer_trace)
    t.manifest["checkpoint"]["ref"] = {"preset": "tiny", "seed": 1, "format": "bf16"}   # not the weights it ran
    with pytest.raises(TraceError, match="checkpoint"):
        promote(t, "replay/y", specs_dir=tmp_path)
    assert not (tmp_path / "replay" / "y.yaml").exists()


def _spec(doc: dict):
    return parse_spec(yaml.safe_dump(doc), "peer.yaml", "replay/peer")


@pytest.mark.parametrize("edit, words", [
    (lambda d: d["inputs"].update(mode="free-run"), "teacher-forced"),
    (lambda d: d["inputs"]["peer"]["logprob_bits"][0].pop(), "must agree"),
    (lambda d: d["inputs"]["peer"]["logprob_bits"][0].__setitem__(0, "3f800000"), "log-probability"),
    (lambda d: d["inputs"]["peer"]["logprob_bits"][0].__setitem__(0, "xyz"), "log-probability"),
    (lambda d: d["inputs"]["peer"]["tokens"][1].__setitem__(0, 10 ** 6), "vocabulary"),
    (lambda d: d["inputs"]["peer"]["tokens"].pop(), "for the spec's 2 request"),
    (lambda d: d["inputs"].update(edits=[{"field": "logprob", "request": 0, "step": 0, "ulp": 1}]), "no edits"),
])
def test_a_peer_spec_with_bad_values_is_refused(tmp_path, peer_trace, edit, words):
    path = promote(read_trace(peer_trace), "replay/z", specs_dir=tmp_path, check=False)
    doc = yaml.safe_load(path.read_text())
    _spec(doc)                                       # as written: valid
    edit(doc)
    with pytest.raises(SpecErrors, match=words):
        _spec(doc)


def test_a_peer_spec_holds_at_most_eight_requests(tmp_path, peer_trace):
    t = read_trace(peer_trace)
    t.requests, t.steps = t.requests * 5, t.steps * 5                   # 10 requests
    with pytest.raises(TraceError, match="at most 8 requests.*--request-indices"):
        promote(t, "replay/many", specs_dir=tmp_path, check=False)
    assert promote(t, "replay/some", list(range(8)), specs_dir=tmp_path, check=False).exists()
