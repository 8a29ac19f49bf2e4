"""Record a seeded batch (plain, chain and tree speculative) and replay it bit for bit on another
batch composition, chunk size and topology (gloo), in both modes; a planted divergence is
located to request, step, layer and op (harness.replay, DESIGN §10)."""

from __future__ import annotations

import pytest

from lockstep.engine.generate import Request
from lockstep.engine.sampling import SamplingParams
from lockstep.harness.replay.format import read_trace, write_trace
from lockstep.harness.replay.record import record
from lockstep.harness.replay.rerun import replay
from lockstep.harness.replay.run import Setup
from tests.engine import planted

TARGET = {"path": "models/tiny-target"}
DRAFT = {"path": "models/tiny-eagle3", "convention": "sglang"}
CHAIN = {"num_steps": 3, "topk": 1, "draft_token_num": 4, "verify": "target-only"}
TREE = {"num_steps": 3, "topk": 2, "draft_token_num": 6, "verify": "target-only"}


def batch() -> list[Request]:
    """Two seeded sampled requests and a greedy one, prompts long enough to chunk."""
    return [Request(list(range(20, 39)), SamplingParams(temperature=0.9, max_new_tokens=6, stop_token_ids=()), seed=11),
            Request([5, 9, 2, 7, 300, 41, 8], SamplingParams(temperature=1.2, top_k=40, max_new_tokens=6,
                                                             stop_token_ids=()), seed=-3),
            Request(list(range(100, 112)), SamplingParams(greedy=True, max_new_tokens=6, stop_token_ids=()))]


# one xdist worker runs the module (pyproject --dist loadgroup): `traces` (three recorded generations,
# ~18 CPU s) once a run
pytestmark = pytest.mark.xdist_group("record-replay")


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """{name: path} of traces recorded once: plain, chain and tree speculative decoding."""
    root = tmp_path_factory.mktemp("traces")
    out = {}
    for name, setup in {"plain": Setup(TARGET),
                        "chain": Setup(TARGET, draft=DRAFT, speculative=CHAIN),
                        "tree": Setup(TARGET, draft=DRAFT, speculative=TREE)}.items():
        out[name] = write_trace(record(setup, batch()), root / f"{name}.jsonl")
    return out


def test_trace_holds_what_section_10_lists(traces):
    t = read_trace(traces["tree"])
    m = t.manifest
    assert m["settings"]["mode"] == "speculative" and m["speculative"] == TREE
    assert m["platform"]["name"] == "cpu-fp32" and m["checkpoint"]["tensors"] and m["draft"]["tensors"]
    assert [r["rng"] for r in t.requests][:2] == ["lockstep-coins-1"] * 2
    step = t.steps[0][0]
    assert len(step["logprob_bits"]) == 8 and len(step["logits_sha256"]) == 64 and step["margin_bits"]
    assert len(step["experts"]) == 4 and all(len(e) == 2 for e in step["experts"])      # 4 layers, top-2
    rnd = t.rounds[0][0]
    assert len(rnd["draft_tokens"]) == TREE["draft_token_num"] and rnd["draft_parents"][0] == -1
    assert rnd["accept_length"] == len(rnd["accepted"]) and rnd["bonus"] is not None
    # the rounds account for every token after the first
    assert sum(r["accept_length"] for r in t.rounds[0]) >= len(t.steps[0]) - 1


@pytest.mark.parametrize("name", ["plain", "chain", "tree"])
@pytest.mark.parametrize("mode", ["free-run", "teacher-forced"])
def test_replay_bitwise_on_another_batch_and_chunking(traces, name, mode):
    report = replay(read_trace(traces[name]), mode, {"order": [2, 0, 1], "max_batch": 2, "prefill_chunk": 5})
    assert report.bitwise, report.text()
    assert report.counts() == {"bitwise": sum(len(s) for s in read_trace(traces[name]).steps)}


@pytest.mark.parametrize("name, mode, tp, ep", [("plain", "free-run", 2, 1), ("plain", "teacher-forced", 1, 2),
                                                ("tree", "free-run", 2, 2)])
def test_replay_bitwise_on_another_topology(traces, name, mode, tp, ep):
    report = replay(read_trace(traces[name]), mode, {"tp": tp, "ep": ep, "order": [1, 2, 0]})
    assert report.bitwise, report.text()


def test_planted_divergence_is_located_to_request_step_layer_and_op(traces, monkeypatch):
    planted.different_tile_when_alone(monkeypatch)      # a one-row decode step walks keys in other tiles
    report = replay(read_trace(traces["plain"]), "teacher-forced", {"max_batch": 1})
    assert not report.bitwise
    first = report.first
    assert (first.request, first.step, first.status) == (0, 1, "bits"), report.text()
    loc = report.located
    assert loc is not None and loc.ops is not None and loc.ops.op is not None, report.text()
    assert (loc.divergence.request, loc.divergence.step) == (0, 1)
    assert loc.ops.op.name == "L0.attention", report.text()
    assert "first op that differs: L0.attention" in report.text()


def test_a_token_flip_is_a_verdict_not_a_crash(traces, monkeypatch):
    """Free-run with the planted bug: every step is judged, the first non-bitwise one is named."""
    planted.different_tile_when_alone(monkeypatch)
    report = replay(read_trace(traces["plain"]), "free-run", {"max_batch": 1}, locate_first=False)
    assert report.first is not None and report.first.step == 1
    assert report.first.status in ("bits", "token", "near-tie")
    assert {v.request for v in report.verdicts} == {0, 1, 2}


@pytest.mark.parametrize("name", ["plain", "tree"])
@pytest.mark.parametrize("chunk", [None, 4])
def test_prefill_shaped_teacher_forcing_gives_the_decode_bits(traces, name, chunk):
    """Every recorded token in chunked forwards (the RL trainer's shape) gives the bits, logits
    digests and routed experts the run recorded one token a step (D3)."""
    report = replay(read_trace(traces[name]), "teacher-forced",
                    {"forced_shape": "prefill", "prefill_chunk": chunk, "order": [1, 2, 0], "max_batch": 2})
    assert report.bitwise, report.text()
