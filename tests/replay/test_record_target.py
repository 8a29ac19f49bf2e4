"""`lockstep record --target NAME`: a target's run (HF transformers, an outside engine registered
through the entry point group lockstep.targets, Lockstep's own adapter) written as a trace and
teacher-forced through the reference with its verdicts judged; a target that cannot run here, or
gives back what the interface does not promise, is one line and exit 2."""

from __future__ import annotations

import json
import sys

import pytest

from lockstep.harness.cli import main
from lockstep.harness.replay.format import read_trace

CKPT = "models/tiny-target"

# An outside engine: Lockstep's engine behind the target interface, declaring a stateless RNG, and
# variants broken on purpose (a shifted logprob, a crash, a token outside the vocabulary, a false
# claim of the coin contract, no generation at all, a factory that crashes).
ADAPTER = '''
import torch
from lockstep.harness.targets import Op, Result, Target
from lockstep.harness.targets.lockstep import load

_generate = load().ops["generate"].fn

def _shifted(checkpoint, requests, **kw):
    out = _generate(checkpoint, requests, **kw)
    for o in out:
        o.logprobs = o.logprobs.clone()
        o.logprobs[2] -= 0.01                          # its distribution departs at step 2
    return out

def _crash(checkpoint, requests, **kw):
    raise RuntimeError("the toy engine fell over")

def _outside(checkpoint, requests, **kw):
    return [Result([1, 99999], torch.tensor([-1.0, -2.0]), "length") for _ in requests]

def _op(fn):
    return Op(fn, features=frozenset({"sampling", "batch", "prefill_chunk"}))

def toy():
    return Target("toy", "2.1", ops={"generate": _op(_generate)}, rng="stateless")

def shifted():
    return Target("shifted", "1", ops={"generate": _op(_shifted)}, rng="stateful")

def crashy():
    return Target("crashy", "1", ops={"generate": _op(_crash)}, rng="stateless")

def outside():
    return Target("outside", "1", ops={"generate": _op(_outside)}, rng="stateless")

def claims_coins():
    return Target("claims", "1", ops={"generate": _op(_generate)}, rng="lockstep-coins-1")

def norng():
    return Target("norng", "1", ops={"generate": _op(_generate)})

def nothing():
    return Target("nothing", "1", ops={}, missing={"generate": "the nothing engine generates nothing"})

def broken():
    raise ImportError("No module named 'toy_runtime'")
'''
NAMES = ("toy", "shifted", "crashy", "outside", "claims_coins", "norng", "nothing", "broken")


@pytest.fixture
def outside_targets(tmp_path, monkeypatch):
    dist = tmp_path / "toyengines-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toyengines\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[lockstep.targets]\n" + "".join(
        f"{n.replace('_', '-')} = toy_record_adapter:{n}\n" for n in NAMES))
    (tmp_path / "toy_record_adapter.py").write_text(ADAPTER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "toy_record_adapter", raising=False)
    return tmp_path


def requests_file(tmp_path, seeded=True):
    path = tmp_path / "reqs.jsonl"
    lines = [{"prompt": list(range(20, 32)), "sampling": {"greedy": True, "max_new_tokens": 5}}]
    if seeded:
        lines.append({"prompt": [7, 300, 41, 8], "seed": 9,
                      "sampling": {"temperature": 0.9, "max_new_tokens": 6, "stop_token_ids": []}})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def replay_json(capsys, trace, *extra):
    code = main(["replay", str(trace), "--mode", "teacher-forced", "--json", *extra])
    return code, json.loads(capsys.readouterr().out)


def refused(capsys, argv, *words):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


def test_hf_generation_recorded_and_teacher_forced_on_the_reference(tmp_path, capsys):
    pytest.importorskip("transformers")
    out = tmp_path / "hf.jsonl"
    assert main(["record", str(out), "--target", "hf", "--checkpoint", CKPT,
                 "--requests", requests_file(tmp_path, seeded=False)]) == 0
    assert "from target hf-" in capsys.readouterr().out
    t = read_trace(out)
    m = t.manifest
    assert m["source"] == "target:hf" and m["engine"]["name"] == "hf" and m["engine"]["version"]
    assert m["target"]["operation"] == "greedy_generate" and m["checkpoint"]["tensors"]
    assert [r["rng"] for r in t.requests] == ["none (greedy)"]
    assert len(t.steps[0]) == 5 and all(s["logits_sha256"] is None for s in t.steps[0])
    code, doc = replay_json(capsys, out)
    # HF sums in other orders: within the threshold, not a claim of bitwise equality
    assert code == 0 and doc["ok"] and doc["first"] is None, doc
    assert set(doc["counts"]) <= {"not recorded", "bits"} and sum(doc["counts"].values()) == 5
    assert 0 < doc["stats"]["max"] < 1e-3 and doc["stats"]["share_over_threshold"] == 0.0
    code, doc = replay_json(capsys, out, "--threshold", "1e-12")       # the same bits, a threshold too tight
    assert code == 1 and doc["first"]["status"] == "bits" and "ULP" in doc["first"]["detail"]


def test_outside_target_recorded_with_its_rng_model_and_replayed(outside_targets, tmp_path, capsys):
    out = tmp_path / "toy.jsonl"
    assert main(["record", str(out), "--target", "toy", "--checkpoint", CKPT, "--requests",
                 requests_file(tmp_path), "--prefill-chunk", "5", "--max-batch", "1"]) == 0
    capsys.readouterr()
    t = read_trace(out)
    assert t.manifest["engine"] == {"name": "toy", "version": "2.1", "description": "", "operation": "generate",
                                    "rng": "stateless"}
    assert t.manifest["target"]["prefill_chunk"] == 5 and t.manifest["target"]["max_batch"] == 1
    assert [r["rng"] for r in t.requests] == ["none (greedy)", "target:toy stateless (seed, position)"]
    code, doc = replay_json(capsys, out, "--order", "1,0")
    # the toy engine is Lockstep's engine: its tokens teacher-forced on the reference give its bits
    # the toy records no logits digest nor routed experts: those steps are "not recorded", not bitwise
    assert code == 0 and doc["ok"] and not doc["bitwise"] and doc["counts"] == {"not recorded": 11}, doc
    assert doc["stats"]["bitwise_equal"] == 11
    refused(capsys, ["replay", str(out)], "request 1", "stateless", "teacher-forced")   # its seed is not ours


def test_a_departing_target_is_named_at_its_step(outside_targets, tmp_path, capsys):
    out = tmp_path / "shifted.jsonl"
    assert main(["record", str(out), "--target", "shifted", "--checkpoint", CKPT,
                 "--requests", requests_file(tmp_path)]) == 0
    capsys.readouterr()
    assert read_trace(out).requests[1]["rng"] == "target:shifted stateful (generator)"
    code, doc = replay_json(capsys, out)
    assert code == 1 and not doc["ok"]
    assert (doc["first"]["request"], doc["first"]["step"], doc["first"]["status"]) == (0, 2, "bits"), doc
    assert doc["first"]["dlogprob"] == pytest.approx(0.01, rel=1e-3)
    assert doc["stats"]["share_over_threshold"] == pytest.approx(2 / 11)
    assert doc["counts"] == {"not recorded": 9, "bits": 2}          # no digest nor experts recorded
    code, doc = replay_json(capsys, out, "--threshold", "0.02")
    assert code == 0 and doc["ok"] and not doc["bitwise"]


def test_lockstep_through_its_target_adapter_replays_bitwise(tmp_path, capsys):
    out = tmp_path / "lockstep.jsonl"
    assert main(["record", str(out), "--target", "lockstep", "--checkpoint", CKPT,
                 "--requests", requests_file(tmp_path)]) == 0
    capsys.readouterr()
    t = read_trace(out)
    assert [r["rng"] for r in t.requests] == ["none (greedy)", "lockstep-coins-1"]
    assert main(["replay", str(out), "--max-batch", "1", "--prefill-chunk", "3"]) == 0    # free-run: our coins
    assert "every step is bitwise equal" in capsys.readouterr().out
    code, doc = replay_json(capsys, out)
    # a target's recording holds no logits digest nor routed experts: teacher-forced, each step is
    # "not recorded" (the logprob bits agree; the rest was not checked), never silently bitwise
    assert code == 0 and doc["ok"] and doc["stats"] is None and doc["counts"] == {"not recorded": 11}, doc


@pytest.mark.parametrize("argv, words", [
    (["--target", "no-such-engine"], ["unknown target 'no-such-engine'", "lockstep.targets"]),
    (["--target", "nothing"], ["no generation operation", "the nothing engine generates nothing"]),
    (["--target", "broken"], ["target 'broken' cannot run here", "No module named 'toy_runtime'"]),
    (["--target", "crashy"], ["generate crashed: RuntimeError: the toy engine fell over (at ",
                              "toy_record_adapter.py:"]),
    (["--target", "outside"], ["step 1: token 99999 is outside the vocabulary"]),
    (["--target", "claims-coins"], ["declares lockstep-coins-1", "'stateless' or 'stateful'"]),
    (["--target", "norng"], ["declares no RNG model", "only greedy requests"]),
    (["--target", "toy", "--tp", "2"], ["--tp set(s) Lockstep's own engine"]),
    (["--target", "toy", "--draft", "models/tiny-eagle3"], ["--draft"]),
])
def test_a_target_that_cannot_record_here_is_one_line_and_exit_2(outside_targets, tmp_path, capsys, argv, words):
    out = tmp_path / "never.jsonl"
    refused(capsys, ["record", str(out), "--checkpoint", CKPT, "--requests", requests_file(tmp_path), *argv], *words)
    assert not out.exists()


def test_peers_without_generation_here_say_what_is_missing(tmp_path, capsys):
    """SGLang and vLLM are driven only through single functions and kernels here: no generation."""
    for name, what in (("sglang", "SGLang"), ("vllm", "vLLM")):
        refused(capsys, ["record", str(tmp_path / "x.jsonl"), "--target", name, "--checkpoint", CKPT,
                         "--prompt-ids", "1,2,3"], f"target '{name}'", what)


def test_hf_refuses_what_greedy_generate_cannot_do(tmp_path, capsys):
    pytest.importorskip("transformers")
    base = ["record", str(tmp_path / "x.jsonl"), "--target", "hf", "--checkpoint", CKPT, "--prompt-ids", "1,2,3"]
    refused(capsys, base + ["--seed", "4"], "only greedy_generate", "not seeded sampling")
    refused(capsys, base + ["--prefill-chunk", "2"], "only greedy_generate", "chunked prefill")
