"""Replay's verdict rules without a model (harness.replay.rerun): the per-step verdicts of a
free run, a teacher-forced run and a speculative round, and how `replay` picks the first
divergence, applies another engine's tolerance and refuses what it cannot replay. The engine's
side (`run`) is replaced by given results, so each rule is driven by exactly the values it reads;
specs/replay/ pins the same rules end to end on recorded traces."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from lockstep.engine.request import Result
from lockstep.harness.replay import rerun as rp
from lockstep.harness.replay.format import Trace, TraceError, f32_bits
from lockstep.harness.replay.observe import StepLog
from lockstep.harness.replay.rerun import ReplayReport, StepVerdict, Verdict, replay

LP = [-0.5, -1.25, -2.0, -0.75]                    # exact in float32: the recorded logprobs


def steps(tokens, lps=LP, **extra):
    return [{"request": 0, "step": k, "token": t, "logprob_bits": f32_bits(lp), **extra}
            for k, (t, lp) in enumerate(zip(tokens, lps))]


def trace_of(step_lists, rounds=None, source="lockstep", rng="none (greedy)", finish="length", speculative=None):
    n = len(step_lists)
    manifest = {"source": source, "requests": n, "speculative": speculative,
                "settings": {"dtype": "fp32", "backend": "torch", "tp": 1, "ep": 1, "max_batch": 8,
                             "prefill_chunk": None, "device": "cpu"},
                "checkpoint": {"ref": {"path": "models/tiny-target"}}, "platform": {}}
    requests = [{"index": i, "prompt": [3, 4, 5], "sampling": {"greedy": True, "max_new_tokens": len(s),
                                                              "stop_token_ids": []},
                 "rng": rng, "tokens": len(s), "finish_reason": finish} for i, s in enumerate(step_lists)]
    return Trace(manifest, requests, [[{**s, "request": i} for s in st] for i, st in enumerate(step_lists)],
                 rounds or [[] for _ in range(n)])


def result(tokens, lps=LP, finish="length", accept=None):
    return Result(list(tokens), torch.tensor(lps[:len(tokens)], dtype=torch.float32), finish, None, accept)


def brief(vs):
    return [(v.request, v.step, v.status.value, v.detail) for v in vs]


# ---------------------------------------------------------------- free run, per step
def test_every_step_bitwise():
    t = trace_of([steps([7, 8, 9])])
    assert brief(rp._token_verdicts(t, 0, [7, 8, 9], torch.tensor(LP[:3]), 1e-3)) == \
        [(0, k, "bitwise", "") for k in range(3)]


def test_other_bits_name_both_the_delta_and_the_ulp():
    t = trace_of([steps([7, 8, 9])])
    lps = torch.tensor([-0.5, float(torch.tensor(-1.25).nextafter(torch.tensor(0.0))), -2.125])
    vs = rp._token_verdicts(t, 0, [7, 8, 9], lps, 1e-3)
    assert brief(vs) == [
        (0, 0, "bitwise", ""),
        (0, 1, "bits", "logprob bf9fffff vs the trace's bfa00000 (|Δ| 1.19e-07, 1 ULP)"),
        (0, 2, "bits", "logprob c0080000 vs the trace's c0000000 (|Δ| 0.125, 524288 ULP)")]
    assert (vs[1].ulp, vs[2].ulp, vs[2].dlogprob) == (1, 524288, 0.125)
    assert vs[1].dlogprob == pytest.approx(2 ** -23, rel=1e-6)


@pytest.mark.parametrize("margin, threshold, status, why", [
    (None, 1e-3, "token", "no recorded margin"),
    ("", 1e-3, "token", "no recorded margin"),
    (0.25, 0.5, "near-tie", "recorded margin 0.25 < 0.5"),
    (0.5, 0.5, "token", "recorded margin 0.5 >= 0.5"),
    (0.75, 0.5, "token", "recorded margin 0.75 >= 0.5"),
    (0.0, 1e-3, "near-tie", "recorded margin 0 < 0.001"),
])
def test_a_token_flip_is_a_near_tie_only_under_a_recorded_margin(margin, threshold, status, why):
    st = steps([7, 8, 9])
    if margin is not None:
        st[1]["margin_bits"] = margin if margin == "" else f32_bits(margin)
    vs = rp._token_verdicts(trace_of([st]), 0, [7, 6, 5], torch.tensor(LP[:3]), threshold)
    assert brief(vs) == [(0, 0, "bitwise", ""), (0, 1, status, f"token 6, the trace has 8 ({why})")]


def test_a_replay_that_stops_early_or_goes_on():
    t = trace_of([steps([7, 8, 9])])
    assert brief(rp._token_verdicts(t, 0, [7, 8], torch.tensor(LP[:2]), 1e-3)) == [
        (0, 0, "bitwise", ""), (0, 1, "bitwise", ""),
        (0, 2, "control", "the replay stopped after 2 tokens, the trace has 3")]
    assert brief(rp._token_verdicts(t, 0, [], torch.tensor([]), 1e-3)) == [
        (0, 0, "control", "the replay stopped after 0 tokens, the trace has 3")]
    longer = rp._token_verdicts(t, 0, [7, 8, 9, 4], torch.tensor(LP), 1e-3)
    assert brief(longer)[3:] == [(0, 3, "control", "the replay went on to 4 tokens, the trace stopped at 3")]
    other = rp._token_verdicts(t, 0, [7, 8, 9, 4], torch.tensor(LP[:2] + [-3.0, -1.0]), 1e-3)
    assert [v.status.value for v in other] == ["bitwise", "bitwise", "bits"]      # no control after a divergence
    empty = trace_of([[]])
    assert brief(rp._token_verdicts(empty, 0, [4], torch.tensor([-1.0]), 1e-3)) == [
        (0, 0, "control", "the replay went on to 1 tokens, the trace stopped at 0")]


# ---------------------------------------------------------------- speculative rounds
def spec_trace():
    rounds = [{"request": 0, "round": 1, "accept_length": 2, "draft_tokens": [8, 9], "draft_parents": [-1, 0]},
              {"request": 0, "round": 2, "accept_length": 1, "draft_tokens": [4], "draft_parents": [-1]}]
    return trace_of([steps([7, 8, 9, 4])], rounds=[rounds])


def spec_log(edits=None):
    log = StepLog([3])
    log.events = {(0, 1): {"draft.tokens": [8, 9], "draft.parents": [-1, 0]},
                  (0, 2): {"draft.tokens": [4], "draft.parents": [-1]}}
    for (r, name), v in (edits or {}).items():
        log.events[(0, r)][name] = v
    return log


def test_a_speculative_run_that_agrees_has_no_control_verdict():
    assert rp._speculative_control(spec_trace(), 0, result([7, 8, 9, 4], accept=[2, 1]), spec_log()) is None


@pytest.mark.parametrize("accept, edits, step, detail", [
    ([3, 1], {}, 1, "verify round 1: accept length 3, the trace has 2"),
    ([2, 2], {}, 3, "verify round 2: accept length 2, the trace has 1"),
    ([2], {}, 3, "verify round 2: accept length None, the trace has 1"),
    ([2, 1], {(1, "draft.tokens"): [8, 5]}, 1, "verify round 1: another draft tree ([8, 5] vs [8, 9])"),
    ([2, 1], {(2, "draft.parents"): [0]}, 3, "verify round 2: another draft tree ([4] vs [4])"),
])
def test_the_first_round_with_another_accept_length_or_tree(accept, edits, step, detail):
    v = rp._speculative_control(spec_trace(), 0, result([7, 8, 9, 4], accept=accept), spec_log(edits))
    assert (v.request, v.step, v.status.value, v.detail) == (0, step, "control", detail)


def test_a_round_missing_from_the_log_is_another_tree():
    log = spec_log()
    del log.events[(0, 2)]
    v = rp._speculative_control(spec_trace(), 0, result([7, 8, 9, 4], accept=[2, 1]), log)
    assert v.detail == "verify round 2: another draft tree (None vs [4])"


# ---------------------------------------------------------------- teacher-forced, per step
def forced_log(digests, experts):
    log = StepLog([3], logits=True)
    log.logits = {(0, k): {"logits_sha256": d} for k, d in enumerate(digests) if d is not None}
    log.experts = {(0, k): e for k, e in enumerate(experts) if e is not None}
    return log


def test_teacher_forced_verdicts_each_rule():
    st = steps([7, 8, 9, 4], logits_sha256="aa", experts=[[1, 2], [3, 4]])
    st[1]["logits_sha256"] = ""                              # not recorded: the digest
    del st[2]["experts"]                                     # not recorded: the experts
    st[3]["experts"] = []                                    # recorded as "no layer routed"
    lps = [-0.5, -1.25, -2.0, -0.75]
    log = forced_log(["aa", "bb", "aa", "aa"], [{1: [3, 4], 0: [1, 2]}, {0: [1, 2], 1: [3, 4]},
                                               {0: [1, 2], 1: [3, 4]}, None])
    vs = rp._forced_verdicts(trace_of([st]), 0, result([7, 8, 9, 4], lps), log)
    assert brief(vs) == [
        (0, 0, "bitwise", ""),
        (0, 1, "not recorded", "the chosen logprob is bitwise; the trace has no logits row's digest: not checked"),
        (0, 2, "not recorded", "the chosen logprob is bitwise; the trace has no routed experts: not checked"),
        (0, 3, "bitwise", "")]
    st[2]["logits_sha256"] = ""
    vs = rp._forced_verdicts(trace_of([st]), 0, SimpleNamespace(logprobs=lps), log)     # a list of logprobs
    assert vs[2].detail == ("the chosen logprob is bitwise; the trace has no routed experts and no logits "
                            "row's digest: not checked")


def test_teacher_forced_bits_routing_and_digest():
    st = steps([7, 8, 9, 4], logits_sha256="aa", experts=[[1, 2], [3, 4]])
    lps = [-0.5, -1.5, -2.0, -0.75]
    log = forced_log(["aa", "aa", "aa", "bb"], [{0: [1, 2], 1: [3, 5]}, {0: [1, 2], 1: [3, 4]},
                                               {0: [1, 2]}, {0: [1, 2], 1: [3, 4]}])
    assert brief(rp._forced_verdicts(trace_of([st]), 0, result([7, 8, 9, 4], lps), log)) == [
        (0, 0, "control", "routing: layer 1 routes to [3, 5], the trace to [3, 4]"),
        (0, 1, "bits", "logprob bfc00000 vs the trace's bfa00000 (|Δ| 0.25, 2097152 ULP)"),
        (0, 2, "control", "routing: layer 1 routes to None, the trace to [3, 4]"),
        (0, 3, "bits", "the logits row's digest differs (the chosen logprob is equal)")]
    vs = rp._forced_verdicts(trace_of([st]), 0, result([7, 8, 9, 4], lps), log)
    assert (vs[1].dlogprob, vs[1].ulp) == (0.25, 2097152)
    st[0]["experts"] = [[1, 2]]                              # the replay routed a layer more
    log.experts[(0, 0)] = {0: [1, 2], 1: [3, 4]}
    assert rp._forced_verdicts(trace_of([st]), 0, result([7, 8, 9, 4], lps), log)[0].detail == \
        "routing: layer 1 routes to [3, 4], the trace to None"


# ---------------------------------------------------------------- replay(): picking the verdict
@pytest.fixture
def engine(monkeypatch):
    """replay() with the identity checks passed and the engine's results given: `engine.results`."""
    state = SimpleNamespace(results=[], located=[], runs=[], events={}, checked=[], located_args=[])
    monkeypatch.setattr(rp, "check_identity", lambda trace, setup: state.checked.append((trace, setup)))

    def run(setup, requests, log, forced=None, dp=1):
        assert dp == 1                          # replay() spreads only when asked (--dp, torchrun's world)
        state.runs.append((setup, forced))
        state.requests, state.log = requests, log
        log.events = state.events
        return state.results

    def locate(*args):
        state.located.append(args[-2:])
        state.located_args.append(args)
        return "located"
    monkeypatch.setattr(rp, "run", run)
    monkeypatch.setattr(rp, "_locate", locate)
    return state


def test_the_first_divergence_is_the_earliest_step_then_the_lowest_request(engine):
    t = trace_of([steps([7, 8, 9]), steps([7, 8, 9]), steps([7, 8, 9])])
    engine.results = [result([7, 8, 6]), result([7, 5, 9]), result([7, 8, 9], [-0.5, -1.0, -2.0])]
    r = replay(t)
    assert [(v.request, v.step, v.status.value) for v in r.verdicts] == [
        (0, 0, "bitwise"), (0, 1, "bitwise"), (0, 2, "token"), (1, 0, "bitwise"), (1, 1, "token"),
        (2, 0, "bitwise"), (2, 1, "bits"), (2, 2, "bitwise")]
    assert (r.first.request, r.first.step) == (1, 1) and r.located == "located" and not r.ok
    assert engine.located == [(r.first, "free-run")]
    trace, setup, requests, tokens, results = engine.located_args[0][:5]
    assert trace is t and setup is engine.runs[0][0] and engine.checked == [(t, setup)]
    assert [q.prompt for q in requests] == [[3, 4, 5]] * 3 and requests == engine.requests
    assert tokens == [[7, 8, 9]] * 3 and results is engine.results
    assert engine.log.prompt_lens == [3, 3, 3] and not engine.log.want_logits
    assert r.mode == "free-run" and r.setup == {"backend": "torch", "tp": 1, "ep": 1, "max_batch": 8,
                                                "forced_shape": "decode"}
    assert r.counts() == {"bitwise": 5, "token": 2, "bits": 1}


def test_no_divergence_and_nothing_located(engine):
    t = trace_of([steps([7, 8]), steps([7, 8])])
    engine.results = [result([7, 8]), result([7, 8])]
    r = replay(t, overrides={"max_batch": 1, "prefill_chunk": None})
    assert r.first is None and r.located is None and r.ok and r.bitwise and engine.located == []
    assert r.setup["max_batch"] == 1 and "prefill_chunk" not in r.setup and r.threshold is None and r.stats is None
    engine.results = [result([7, 9]), result([7, 8])]
    r = replay(t, locate_first=False)
    assert (r.first.request, r.first.step) == (0, 1) and r.located is None and engine.located == []


def test_a_finish_reason_change_is_control_only_after_bitwise_steps(engine):
    t = trace_of([steps([7, 8])], finish="stop")
    engine.results = [result([7, 8])]
    r = replay(t)
    assert brief(r.verdicts)[-1] == (0, 1, "control", "finish length, the trace stop")
    engine.results = [result([7, 9])]
    assert [v.status.value for v in replay(t).verdicts] == ["bitwise", "token"]


def test_a_speculative_control_verdict_replaces_the_later_steps(engine):
    t = spec_trace()
    t.manifest["speculative"] = {"num_steps": 2}
    t.manifest["draft"] = {"ref": {"path": "models/tiny-eagle3"}}
    engine.events = spec_log().events
    engine.results = [result([7, 8, 9, 5], accept=[3, 1])]
    r = replay(t)
    assert brief(r.verdicts) == [(0, 0, "bitwise", ""), (0, 1, "control", "verify round 1: accept length 3, the "
                                                                          "trace has 2")]
    assert r.first is r.verdicts[1]
    engine.results = [result([7, 8, 6, 4], accept=[2, 1])]
    assert [(v.step, v.status.value) for v in replay(t).verdicts] == [(0, "bitwise"), (1, "bitwise"), (2, "token")]
    engine.results = [result([7, 6, 9, 4], accept=[2, 2])]       # a token flip before the control round
    assert [(v.step, v.status.value) for v in replay(t).verdicts] == [(0, "bitwise"), (1, "token"), (3, "control")]
    engine.results = [result([7, 8, 9, 6], accept=[2, 2])]       # and at the control round's step
    assert [(v.step, v.status.value) for v in replay(t).verdicts] == [(0, "bitwise"), (1, "bitwise"), (2, "bitwise"),
                                                                      (3, "control")]


def test_teacher_forced_runs_the_recorded_tokens_and_not_recorded_is_no_divergence(engine, monkeypatch):
    st = steps([7, 8])
    t = trace_of([st], rng="some-other-rng")
    engine.results = [result([7, 8])]
    r = replay(t, mode="teacher-forced")
    assert engine.runs[0][1] == [[7, 8]] and engine.log.want_logits and engine.runs[0][0].tp == 1
    assert [(q.prompt, q.params.max_new_tokens) for q in engine.requests] == [([3, 4, 5], 2)]
    assert [v.status.value for v in r.verdicts] == ["not recorded", "not recorded"]
    assert r.first is None and r.ok and not r.bitwise and r.mode == "teacher-forced"


@pytest.mark.parametrize("source, judged", [("lockstep", False), ("target:lockstep", False),
                                            ("target:peer", True), ("peer:vllm", True), (None, True)])
def test_which_traces_are_another_engines(source, judged):
    t = trace_of([steps([7])], source=source)
    if source is None:
        del t.manifest["source"]
    assert rp.foreign(t) is judged


def test_another_engines_trace_is_judged_within_its_threshold(engine):
    t = trace_of([steps([7, 8, 9])], source="target:peer")
    engine.results = [result([7, 8, 9], [-0.5, -1.0, -2.0])]            # step 1 off by exactly 0.25
    r = replay(t, threshold=0.25)
    assert r.first is None and r.ok and r.threshold == 0.25 and engine.located == []
    assert r.stats == {"tokens": 3, "bitwise_equal": 2, "p50": 0.0, "p95": 0.25, "p99": 0.25, "max": 0.25,
                       "mean": 0.25 / 3, "share_over_threshold": 0.0, "threshold": 0.25}
    assert r.rl["overall"]["max_abs_delta"] == 0.25 and [q["request"] for q in r.rl["per_request"]] == [0]
    r = replay(t, threshold=0.125)
    assert (r.first.step, r.first.status.value) == (1, "bits") and r.located is None and engine.located == []
    assert r.stats["share_over_threshold"] == pytest.approx(1 / 3)
    engine.results = [result([7, 6, 9], [-0.5, -1.25, -2.0])]
    r = replay(t, threshold=1.0)
    assert (r.first.step, r.first.status.value) == (1, "token")      # a tolerance never excuses a token flip


def test_the_statistics_of_infinite_logprobs():
    t = trace_of([steps([7, 8, 9], [-math.inf, -math.inf, -1.0])], source="target:peer")
    res = [result([7, 8, 9], [-math.inf, -1.0, -math.inf])]
    st = rp._stats(t, res, 1e-3)[0]
    assert (st["tokens"], st["bitwise_equal"], st["p50"], st["max"]) == (3, 1, math.inf, math.inf)
    assert rp._stats(t, [result([7], [-math.inf])], 1e-3)[0]["tokens"] == 1      # only the steps both have
    t = trace_of([steps([7, 8], [-math.inf, -1.0])], source="target:peer")
    st = rp._stats(t, [result([7, 8], [-math.inf, -1.25])], 1e-3)[0]    # -inf on both sides: 0 apart
    assert (st["p50"], st["max"], st["mean"], st["bitwise_equal"]) == (0.0, 0.25, 0.125, 1)


# ---------------------------------------------------------------- replay(): refusals
@pytest.mark.parametrize("kwargs, text", [
    ({"mode": "greedy"}, "mode must be one of ('free-run', 'teacher-forced'), got 'greedy'"),
    ({"threshold": 0}, "threshold must be a finite number > 0, got 0"),
    ({"threshold": -1.0}, "threshold must be a finite number > 0, got -1.0"),
    ({"threshold": math.inf}, "threshold must be a finite number > 0, got inf"),
    ({"threshold": "1"}, "threshold must be a finite number > 0, got '1'"),
    ({"overrides": {"dtype": "bf16", "seed": 1}}, "a replay may not change seed (only backend, tp, ep, "
                                                  "max_batch, prefill_chunk, order, forced_shape, device, dtype)"),
    ({"overrides": {"order": [0, 0]}}, "--order must list every request index 0..1 once, got [0, 0]"),
])
def test_what_replay_refuses(engine, kwargs, text):
    t = trace_of([steps([7]), steps([7])])
    with pytest.raises(TraceError) as e:
        replay(t, **kwargs)
    assert str(e.value) == text and engine.runs == []


def test_free_run_refuses_another_rng_and_teacher_forcing_takes_it(engine):
    t = trace_of([steps([7]), steps([7])], source="target:peer")
    t.requests[1]["rng"] = "torch-philox"
    with pytest.raises(TraceError) as e:
        replay(t)
    assert str(e.value) == ("request 1 of this target:peer trace was sampled with RNG 'torch-philox', not Lockstep's "
                            "coin contract: it can only be teacher-forced (--mode teacher-forced)")
    t.requests[1]["rng"] = "lockstep-coins-1"
    engine.results = [result([7]), result([7])]
    assert replay(t, threshold=1.0).ok
    engine.results = [result([7]), result([7], [-0.25])]
    r = replay(t, mode="teacher-forced", threshold=0.125)
    assert [(v.request, v.status.value) for v in r.verdicts] == [(0, "not recorded"), (1, "bits")]
    assert (r.first.request, r.first.status.value) == (1, "bits")


def test_an_override_and_an_order_that_lists_every_request(engine):
    t = trace_of([steps([7]), steps([7])])
    engine.results = [result([7]), result([7])]
    replay(t, overrides={"order": [1, 0], "tp": 2, "ep": None})
    setup = engine.runs[0][0]
    assert (setup.order, setup.tp, setup.ep, setup.checkpoint) == ([1, 0], 2, 1, {"path": "models/tiny-target"})


def test_the_near_tie_threshold_reaches_the_verdicts(engine):
    st = steps([7, 8])
    st[1]["margin_bits"] = f32_bits(0.25)
    engine.results = [result([7, 9])]
    assert replay(trace_of([st]), near_tie=0.5).first.status.value == "near-tie"
    assert replay(trace_of([st])).first.status.value == "token"


def test_a_replay_may_name_the_checkpoint_folder(engine):
    t = trace_of([steps([7])])
    engine.results = [result([7])]
    replay(t, overrides={"checkpoint": {"path": "/elsewhere/tiny"}})
    assert engine.runs[0][0].checkpoint == {"path": "/elsewhere/tiny"}


def test_the_recorded_setup_takes_every_setting_from_the_manifest():
    t = trace_of([steps([7])], speculative={"num_steps": 3})
    t.manifest["settings"] = {"dtype": "bf16", "backend": "triton", "tp": 2, "ep": 3, "max_batch": 5,
                              "prefill_chunk": 7, "device": "cuda"}
    t.manifest["draft"] = {"ref": {"path": "models/tiny-eagle3"}}
    s = rp.recorded_setup(t)
    assert (s.checkpoint, s.dtype, s.backend, s.tp, s.ep, s.max_batch, s.prefill_chunk, s.draft, s.speculative,
            s.device, s.order) == ({"path": "models/tiny-target"}, "bf16", "triton", 2, 3, 5, 7,
                                   {"path": "models/tiny-eagle3"}, {"num_steps": 3}, "cuda", None)
    t.manifest["draft"] = None
    assert rp.recorded_setup(t).draft is None


def test_a_request_record_that_cannot_be_read(engine):
    t = trace_of([steps([7])])
    t.requests[0]["sampling"] = {"temprature": 1.0}
    with pytest.raises(TraceError) as e:
        replay(t)
    assert str(e.value).startswith("a request record is unusable: SamplingParams: unknown field 'temprature'")


# ---------------------------------------------------------------- the report
class FakeLocated:
    def text(self):
        return "located: layer 3, op attention"

    def to_json(self):
        return {"layer": 3}


def test_the_report_counts_and_its_located_and_capped_parts():
    vs = [StepVerdict(0, k, Verdict.BITWISE) for k in range(3)] + \
         [StepVerdict(1, k, Verdict.BITS, "d", 0.5, 1) for k in range(201)]
    r = ReplayReport("free-run", {}, vs, first=vs[3], located=FakeLocated(), threshold=0.25,
                     stats={"p50": 0.5, "p95": 0.5, "p99": 0.5, "max": 0.5, "mean": 0.5,
                            "share_over_threshold": 0.5, "bitwise_equal": 3, "tokens": 204})
    assert r.counts() == {"bitwise": 3, "bits": 201}
    assert r.text().splitlines() == [
        "replay (free-run; ): 204 steps, 201 bits, 3 bitwise",
        "another engine's trace: |Δlogprob| p50 0.5, p95 0.5, p99 0.5, max 0.5 (mean 0.5); 50.0% over 0.25; "
        "3 of 204 bitwise equal",
        "first divergence: request 1, step 0: bits: d",
        "located: layer 3, op attention"]
    doc = r.to_json()
    assert doc["located"] == {"layer": 3} and doc["counts"] == {"bitwise": 3, "bits": 201}
    assert len(doc["divergent"]) == 200 and doc["divergent"][-1]["step"] == 199


def test_check_identity_checks_the_platform_of_the_replay_and_both_checkpoints(monkeypatch):
    calls = []
    monkeypatch.setattr(rp, "platform_identity", lambda *a: calls.append(("platform_identity", a)) or "here")
    monkeypatch.setattr(rp, "check_platform", lambda *a: calls.append(("check_platform", a)))
    monkeypatch.setattr(rp, "check_checkpoint", lambda *a: calls.append(("check_checkpoint", a)))
    monkeypatch.setattr(rp, "checkpoint_folder", lambda s: "target-folder")
    monkeypatch.setattr(rp, "draft_folder", lambda s: "draft-folder")
    t = trace_of([steps([7])])
    t.manifest.update(platform="recorded-platform", checkpoint="recorded-target", draft="recorded-draft")
    setup = rp.Setup({"path": "x"}, dtype="bf16", backend="triton", device="cuda")
    rp.check_identity(t, setup)
    assert calls == [("platform_identity", ("bf16", "triton", "cuda")), ("check_platform", ("recorded-platform", "here")),
                     ("check_checkpoint", ("recorded-target", "target-folder"))]
    calls.clear()
    setup.draft = {"path": "d"}
    rp.check_identity(t, setup)
    assert calls[2:] == [("check_checkpoint", ("recorded-target", "target-folder")),
                         ("check_checkpoint", ("recorded-draft", "draft-folder", "draft"))]
