"""A peer's logprobs are compared as the peer declares it processed them (raw, temperature-scaled,
top-p renormalised), and import-peer takes --device / --dtype and is bounded like record."""

import json
import math

import pytest
import torch

from lockstep.harness.cli import main
from lockstep.harness.replay.format import f32_from_bits, read_trace
from lockstep.harness.replay.processed import Processing, processed_logprob

TARGET = "models/tiny-target"


def test_processed_logprob_formulas():
    row = torch.tensor([2.0, 1.0, 0.0])
    want = torch.log_softmax(row.double() / 2, -1)
    assert processed_logprob(row, 1, Processing("temperature", 2.0)) == pytest.approx(float(want[1]), rel=1e-6)
    assert processed_logprob(row, 1, Processing("raw")) == pytest.approx(float(torch.log_softmax(row, -1)[1]))
    # p = [.665, .245, .090]: a 0.5 nucleus holds id 0 alone, a 0.8 nucleus ids 0 and 1
    assert processed_logprob(row, 0, Processing("top-p", 1.0, 0.5)) == 0.0
    assert processed_logprob(row, 1, Processing("top-p", 1.0, 0.5)) == -math.inf
    p01 = torch.softmax(row, -1)[:2].double()
    assert processed_logprob(row, 1, Processing("top-p", 1.0, 0.8)) == pytest.approx(math.log(p01[1] / p01.sum()))
    with pytest.raises(ValueError, match="--peer-logprobs temperature or top-p"):
        Processing("raw", 0.7)


@pytest.fixture(scope="module")
def greedy(tmp_path_factory):
    d = tmp_path_factory.mktemp("greedy")
    assert main(["record", str(d / "t.jsonl"), "--checkpoint", TARGET, "--prompt-ids", "4,5,6",
                 "--prompt-ids", "7,1", "--max-new-tokens", "4", "--device", "cpu"]) == 0
    trace = read_trace(d / "t.jsonl")
    return [(r["prompt"], [s["token"] for s in steps], [f32_from_bits(s["logprob_bits"]) for s in steps])
            for r, steps in zip(trace.requests, trace.steps)]


def write(tmp_path, rollouts, value):
    path = tmp_path / "peer.jsonl"
    path.write_text("".join(json.dumps({"prompt_ids": p, "response_ids": t, "logprobs": [value(lp) for lp in lps]})
                            + "\n" for p, t, lps in rollouts))
    return path


def peer(capsys, path, *more):
    code = main(["import-peer", str(path), "--format", "rollouts", "--checkpoint", TARGET, "--device", "cpu",
                 "--json", *more])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if out.out.strip() else out.err)


def test_a_top_p_peer_is_compared_as_top_p(tmp_path, greedy, capsys):
    """Greedy tokens under a tiny nucleus: the argmax alone, so each renormalised logprob is exactly 0."""
    path = write(tmp_path, greedy, lambda lp: 0.0)
    code, doc = peer(capsys, path, "--peer-logprobs", "top-p", "--top-p", "1e-9")
    assert code == 0 and doc["ok"] and doc["stats"]["max"] == 0.0 and doc["logprobs"] == "top-p"
    code, doc = peer(capsys, path)                               # the same numbers read as raw logprobs: off
    assert code == 1 and not doc["ok"]


def test_a_temperature_peer_is_compared_as_temperature(tmp_path, greedy, capsys):
    raw = write(tmp_path, greedy, lambda lp: lp)
    assert peer(capsys, raw, "--peer-logprobs", "temperature", "--temperature", "1")[0] == 0
    code, doc = peer(capsys, raw, "--peer-logprobs", "temperature", "--temperature", "0.5")
    assert code == 1 and doc["stats"]["rl"]["outside_clip"] > 0


def test_the_declaration_travels_with_the_trace_to_replay(tmp_path, greedy, capsys):
    path = write(tmp_path, greedy, lambda lp: 0.0)
    assert peer(capsys, path, "--peer-logprobs", "top-p", "--top-p", "1e-9", "--out", str(tmp_path / "p.jsonl"))[0] == 0
    assert read_trace(tmp_path / "p.jsonl").manifest["peer_logprobs"] == {"kind": "top-p", "temperature": 1.0,
                                                                          "top_p": 1e-9}
    assert main(["replay", str(tmp_path / "p.jsonl"), "--mode", "teacher-forced", "--device", "cpu"]) == 0


def test_import_peer_is_bounded_like_record(tmp_path, greedy, capsys):
    path = write(tmp_path, greedy, lambda lp: lp)
    code, err = peer(capsys, path, "--max-seconds", "1e-6")
    assert code == 2 and "import-peer would take about" in err and "--max-seconds" in err
    code, err = peer(capsys, path, "--max-gb", "1e-12")
    assert code == 2 and "KV cache" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
@pytest.mark.parametrize("argv", [["record", "OUT", "--checkpoint", TARGET, "--prompt-ids", "1"],
                                  ["import-peer", "PEER", "--format", "rollouts", "--checkpoint", TARGET]])
def test_device_cuda_without_a_gpu_is_one_line(tmp_path, greedy, capsys, argv):
    argv = [str(tmp_path / "o.jsonl") if a == "OUT" else str(write(tmp_path, greedy, lambda lp: lp)) if a == "PEER"
            else a for a in argv]
    assert main(argv + ["--device", "cuda"]) == 2
    assert "torch sees no CUDA device" in capsys.readouterr().err


def test_lockstep_own_trace_replays_only_on_its_platform(tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    assert main(["record", str(out), "--checkpoint", TARGET, "--prompt-ids", "4,5", "--max-new-tokens", "2",
                 "--device", "cpu"]) == 0
    assert main(["replay", str(out), "--device", "cpu"]) == 0
    assert main(["replay", str(out), "--dtype", "bf16"]) == 2
    assert "recorded on platform cpu-fp32, this replay runs on cpu-bf16" in capsys.readouterr().err
