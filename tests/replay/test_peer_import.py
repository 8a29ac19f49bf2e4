"""A real peer's run (HF transformers generate() on the tiny target) imported as a trace and
teacher-forced through Lockstep's engine: per-token |Δlogprob| statistics, never a mean alone."""

from __future__ import annotations

import json

import pytest
import torch

from lockstep.harness.cli import main
from lockstep.harness.replay.peer import import_peer, teacher_force_peer

transformers = pytest.importorskip("transformers")

TARGET = {"path": "models/tiny-target"}
PROMPTS = [list(range(20, 36)), [7, 300, 41, 8, 2, 99]]
NEW = 8


@pytest.fixture(scope="module")
def hf_rollouts():
    """[(prompt, token ids, logprobs)] from HF's own greedy generate, logprobs from its logits."""
    from transformers import GptOssForCausalLM
    model = GptOssForCausalLM.from_pretrained("models/tiny-target", dtype=torch.float32,
                                              attn_implementation="eager").eval()
    out = []
    with torch.no_grad():
        for prompt in PROMPTS:
            g = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW,
                               output_logits=True, return_dict_in_generate=True, pad_token_id=508)
            ids = g.sequences[0, len(prompt):].tolist()
            lps = [torch.log_softmax(lg[0].float(), -1)[t].item() for lg, t in zip(g.logits, ids)]
            out.append((prompt, ids, lps))
    return out


def write_forms(tmp_path, rollouts):
    """The same HF run in each accepted shape: rollouts JSONL, SGLang and vLLM responses."""
    r = tmp_path / "rollouts.jsonl"
    r.write_text("".join(json.dumps({"prompt_ids": p, "response_ids": t, "logprobs": lp}) + "\n"
                         for p, t, lp in rollouts))
    s = tmp_path / "sglang.json"
    s.write_text(json.dumps([{"output_ids": t, "meta_info": {
        "input_token_logprobs": [[None, x, None] for x in p],
        "output_token_logprobs": [[v, x, None] for v, x in zip(lp, t)]}} for p, t, lp in rollouts]))
    v = tmp_path / "vllm.json"
    v.write_text(json.dumps([{"prompt_token_ids": p, "outputs": [{"token_ids": t, "logprobs": [
        {str(x): {"logprob": val}} for x, val in zip(t, lp)]}]} for p, t, lp in rollouts]))
    return {"rollouts": r, "sglang": s, "vllm": v}


@pytest.mark.parametrize("fmt", ["rollouts", "sglang", "vllm"])
def test_hf_run_teacher_forced_through_lockstep(tmp_path, hf_rollouts, fmt):
    path = write_forms(tmp_path, hf_rollouts)[fmt]
    trace = import_peer(path, fmt, TARGET)
    assert [r["prompt"] for r in trace.requests] == PROMPTS
    report = teacher_force_peer(trace, threshold=1e-3)
    s = report.stats()
    assert s["tokens"] == NEW * len(PROMPTS)
    # HF sums in other orders (MKL GEMMs, one-shot softmax): close, not bitwise (tests/engine/test_hf_agreement.py)
    assert 0 < s["max"] < 1e-3 and s["share_over_threshold"] == 0.0, report.text()
    assert s["p95"] <= s["max"] and "p95" in report.text() and "max" in report.text()


def test_a_departing_peer_is_named(tmp_path, hf_rollouts):
    prompt, ids, lps = hf_rollouts[1]
    bad = list(lps)
    bad[5] += 0.25                                          # the peer's distribution departs at step 5
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": prompt, "tokens": ids, "rollout_log_probs": bad}) + "\n")
    report = teacher_force_peer(import_peer(path, "rollouts", TARGET), threshold=1e-3)
    assert report.first_off == {0: 5}
    s = report.stats()
    assert s["share_over_threshold"] == pytest.approx(1 / NEW) and s["max"] == pytest.approx(0.25, abs=1e-3)
    assert report.worst[0]["step"] == 5


def test_import_peer_cli(tmp_path, hf_rollouts, capsys):
    path = write_forms(tmp_path, hf_rollouts)["sglang"]
    assert main(["import-peer", str(path), "--format", "sglang", "--checkpoint", "models/tiny-target",
                 "--out", str(tmp_path / "peer.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "p95" in out and "max" in out and "over 0.001" in out
    assert (tmp_path / "peer.jsonl").exists()
    bad = tmp_path / "nothing.json"
    bad.write_text(json.dumps({"text": "hello"}))
    assert main(["import-peer", str(bad), "--format", "sglang", "--checkpoint", "models/tiny-target"]) == 2
    err = capsys.readouterr().err
    assert "not sglang output with token ids and logprobs" in err and "Traceback" not in err
