"""`lockstep record` and `lockstep replay` end to end through the command line, tree speculative
decoding included: exit 0 when every step is bitwise, 1 with the first divergence named."""

from __future__ import annotations

import json

from lockstep.harness.cli import main
from lockstep.harness.replay.format import read_trace
from tests.engine import planted


def test_record_and_replay_speculative_tree_from_the_cli(tmp_path, capsys, monkeypatch):
    reqs = tmp_path / "reqs.jsonl"
    reqs.write_text(json.dumps({"prompt": list(range(40, 52)), "seed": 8,
                                "sampling": {"temperature": 0.8, "max_new_tokens": 5, "stop_token_ids": []}}) + "\n" +
                    json.dumps({"prompt": [3, 5, 7], "sampling": {"greedy": True, "max_new_tokens": 4}}) + "\n")
    out = tmp_path / "tree.jsonl"
    assert main(["record", str(out), "--checkpoint", "models/tiny-target", "--requests", str(reqs),
                 "--draft", "models/tiny-eagle3", "--draft-topk", "2", "--num-steps", "2", "--draft-token-num", "4"]) == 0
    assert "recorded 2 requests" in capsys.readouterr().out
    t = read_trace(out)
    assert t.manifest["checkpoint"]["ref"] == {"path": "models/tiny-target"} and t.rounds[0]
    assert main(["replay", str(out), "--order", "1,0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["bitwise"] and doc["counts"] == {"bitwise": sum(len(s) for s in t.steps)}
    assert main(["replay", str(out), "--mode", "teacher-forced", "--max-batch", "1"]) == 0
    assert "every step is bitwise equal" in capsys.readouterr().out

    planted.different_tile_when_alone(monkeypatch)
    assert main(["replay", str(out), "--mode", "teacher-forced", "--max-batch", "1"]) == 1
    text = capsys.readouterr().out
    assert "first divergence: request 0, step 1: bits" in text and "first op that differs: L0.attention" in text


def test_record_and_replay_hand_the_engine_a_torch_device_not_a_platform_name(monkeypatch):
    """On a GPU the platform is named 'cuda-sm90'; the engine's Setup takes the torch device 'cuda'
    (the platform's name there made `record --device cuda` fail on an H100)."""
    import torch

    from lockstep.harness.commands.replay import _device_name

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert _device_name("cuda") == "cuda" and _device_name(None) == "cuda"
    assert _device_name("cpu") == "cpu"
