"""What replay() hands on and keeps, without a model (harness/replay/rerun.py): the data-parallel
degree given to `run`, the setup it shows, the notes of a Lockstep trace, the teacher-forced
path's processed log, the replay's own logprob bits, another engine's statistics (the clip, the
RL figures even when no step was compared) and the command's JSON and text, the overrides it
refuses. tests/replay/test_verdict_rules.py pins the verdicts themselves."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from lockstep.harness.replay import rerun as rp
from lockstep.harness.replay.deltas import Deltas, rl_line
from lockstep.harness.replay.format import TraceError, f32_bits_all
from tests.replay.test_verdict_rules import result, steps, trace_of


@pytest.fixture
def engine(monkeypatch):
    """replay() with the identity checks passed, the results given, and what `run` got recorded."""
    state = SimpleNamespace(results=[], runs=[], degrees=[], notes=[])
    monkeypatch.setattr(rp, "check_identity", lambda trace, setup: None)
    monkeypatch.setattr(rp, "_locate", lambda *a: "located")

    def degree(dp, tp, ep):
        state.degrees.append((dp, tp, ep))
        return 3

    def run(setup, requests, log, forced=None, **kw):
        state.runs.append((setup, forced, kw))
        return state.results

    def notes(manifest, setup):
        state.notes.append((manifest, setup))
        return ["a note"]

    monkeypatch.setattr(rp, "degree", degree)
    monkeypatch.setattr(rp, "run", run)
    monkeypatch.setattr(rp, "replay_notes", notes)
    return state


def test_the_data_parallel_degree_reaches_run_in_each_mode(engine):
    t = trace_of([steps([7, 8])])
    engine.results = [result([7, 8])]
    rp.replay(t, dp=2)
    rp.replay(t, mode="teacher-forced")
    assert engine.degrees == [(2, 1, 1), (None, 1, 1)]
    assert [kw for _, _, kw in engine.runs] == [{"dp": 3}, {"dp": 3}]


def test_the_device_and_dtype_are_shown_only_when_given(engine):
    t = trace_of([steps([7, 8])])
    engine.results = [result([7, 8])]
    assert "device" not in rp.replay(t).setup and "dtype" not in rp.replay(t).setup
    r = rp.replay(t, overrides={"device": "cpu", "dtype": "fp32"})
    assert (r.setup["device"], r.setup["dtype"]) == ("cpu", "fp32")


def test_a_lockstep_trace_gets_its_notes_and_another_engines_none(engine):
    t = trace_of([steps([7, 8])])
    engine.results = [result([7, 8])]
    r = rp.replay(t)
    assert r.notes == ["a note"] and engine.notes == [(t.manifest, engine.runs[0][0])]
    engine.notes.clear()
    r = rp.replay(trace_of([steps([7, 8])], source="peer"))
    assert r.notes == [] and engine.notes == []


def test_the_replayed_bits_are_the_replays_own(engine):
    t = trace_of([steps([7, 8]), steps([7])])
    engine.results = [result([7, 8], [-0.5, -1.5]), result([7], [-0.25])]
    assert rp.replay(t).replayed == [f32_bits_all([-0.5, -1.5]), f32_bits_all([-0.25])]


def test_teacher_forcing_reads_the_processed_log(engine, monkeypatch):
    seen = []
    real = rp.processed.forced_log

    def forced_log(manifest, prompt_lens, tokens):
        seen.append(("log", manifest, prompt_lens, tokens))
        return real(manifest, prompt_lens, tokens)

    monkeypatch.setattr(rp.processed, "forced_log", forced_log)
    monkeypatch.setattr(rp.processed, "apply", lambda log, results: seen.append(("apply", log, results)))
    t = trace_of([steps([7, 8, 9])])
    engine.results = [result([7, 8, 9])]
    rp.replay(t, mode="teacher-forced")
    (setup, forced, _), = engine.runs
    assert seen[0] == ("log", t.manifest, [3], [[7, 8, 9]]) and forced == [[7, 8, 9]]
    assert seen[1][0] == "apply" and seen[1][1] is not None and seen[1][2] is engine.results


def test_another_engines_statistics_take_the_clip(engine, monkeypatch):
    seen = []
    monkeypatch.setattr(rp, "_stats", lambda trace, results, threshold, clip: seen.append((threshold, clip)) or ({}, {}))
    t = trace_of([steps([7, 8])], source="peer")
    engine.results = [result([7, 8])]
    rp.replay(t, threshold=0.5)
    rp.replay(t, threshold=0.5, clip=0.7)
    assert seen == [(0.5, 0.2), (0.5, 0.7)]


def test_the_statistics_of_each_kind_of_logprobs():
    t = trace_of([steps([7, 8], [-0.5, -1.0])], source="peer")
    for lps in ([-0.5, -1.25], torch.tensor([-0.5, -1.25])):
        stats, rl = rp._stats(t, [SimpleNamespace(logprobs=lps)], 0.1, 0.7)
        d = Deltas("peer", 0.1, 0.7)
        d.add_request(t.steps[0], [-0.5, -1.25])
        want = d.stats()
        assert stats == {k: v for k, v in want.items() if k != "rl"}
        assert rl == {"overall": want["rl"], "per_request": d.per_request()}
    assert rp._stats(t, [SimpleNamespace(logprobs=[-0.5, -1.25])], 0.1) == \
        rp._stats(t, [SimpleNamespace(logprobs=[-0.5, -1.25])], 0.1, 0.2), "PPO's clip by default"
    stats, rl = rp._stats(trace_of([[]], source="peer"), [SimpleNamespace(logprobs=[])], 0.1)
    assert stats == {} and rl["overall"] == {}, "no step compared: empty figures, never None"


def test_the_floats_of_a_tensor_or_a_list():
    got = rp._floats(torch.tensor([-0.5, -1.25]))
    assert got == [-0.5, -1.25] and all(type(x) is float for x in got)
    assert rp._floats([-0.5, -2.0]) == [-0.5, -2.0] and rp._floats((1.0,)) == [1.0]


def test_the_commands_json_and_text_add_the_rl_figures_and_the_notes():
    r = rp.ReplayReport("free-run", {"tp": 1})
    r.verdicts = [rp.StepVerdict(0, 0, rp.Verdict.BITWISE)]
    r.notes = ["n1", "n2"]
    assert r.command_json() == r.to_json() | {"notes": ["n1", "n2"]}
    assert r.command_text() == r.text() + "\nnote: n1\nnote: n2"
    d = Deltas("peer", 0.1)
    d.add_request(steps([7, 8], [-0.5, -1.0]), [-0.5, -1.25])
    st = d.stats()
    r.stats, r.threshold = {k: v for k, v in st.items() if k != "rl"}, 0.1
    r.rl = {"overall": st["rl"], "per_request": d.per_request()}
    doc = r.command_json()
    assert doc["stats"] == r.stats | {"rl": st["rl"], "per_request": d.per_request()} and doc["notes"] == ["n1", "n2"]
    assert json.loads(json.dumps(doc)) == doc
    assert r.command_text() == "\n".join([r.text(), rl_line(st["rl"]), "note: n1", "note: n2"])
    r.rl, r.notes = {"overall": {}, "per_request": []}, []
    assert r.command_text() == r.text(), "no RL line without figures"
    assert r.command_json()["stats"] == r.stats | {"rl": {}, "per_request": []}


def test_overrides_a_replay_may_not_change_are_named():
    t = trace_of([steps([7])])
    with pytest.raises(TraceError) as e:
        rp.replay_setup(t, {"temperature": 1.0, "seed": 3, "tp": 2})
    assert str(e.value) == f"a replay may not change seed, temperature (only {', '.join(rp.OVERRIDABLE)})"
