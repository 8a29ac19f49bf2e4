"""What replay hands lockstep.harness.locate (lockstep.harness.replay.rerun._locate), without a model: the level-1
divergence it builds from the trace and the replay's results (accept lengths only for a
speculative free run; the first verdict's step when only routing or a digest differs), the
requests and forced tokens each side's re-run gets, and the request's index in each re-run's
batch order. lockstep.harness.locate.locate and the engine's `run` are replaced by recorders; the located
test in test_record_replay.py runs the real ones on a planted divergence."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import lockstep.harness.locate
from lockstep.engine.request import Request, SamplingParams
from lockstep.harness.replay import rerun as rp
from lockstep.harness.replay.rerun import StepVerdict, Verdict
from lockstep.harness.replay.run import Setup

from tests.replay.test_verdict_rules import LP, result, steps, trace_of

PROMPTS = [[3, 4, 5], [1, 2], [6, 7, 8, 9]]          # lengths 3, 2, 4: a position names its request


@pytest.fixture
def calls(monkeypatch):
    """locate's arguments (`calls.located`) and every re-run (`calls.runs`: setup, requests, log,
    forced, engine_trace), with the real functions' signatures."""
    st = SimpleNamespace(located=[], runs=[])

    def locate(sides, divergence, rerun_reference, rerun_other, request_in=None):
        st.located.append(SimpleNamespace(sides=sides, d=divergence, go_ref=rerun_reference, go_other=rerun_other,
                                          request_in=request_in))
        return "located"

    def run(setup, requests, log=None, forced=None, engine_trace=None):
        st.runs.append((setup, requests, log, forced, engine_trace))
    monkeypatch.setattr(lockstep.harness.locate, "locate", locate)
    monkeypatch.setattr(rp, "run", run)
    return st


def requests():
    return [Request(p, SamplingParams(temperature=0.7, max_new_tokens=9), seed=5) for p in PROMPTS]


def divergence(d):
    return (d.request, d.step, d.token, d.position, d.speculative, [str(w) for w in d.what])


def test_teacher_forced_hands_the_forced_requests_and_each_sides_batch_position(calls):
    """Request 2's logprob of token 1 differs (request 1's token 2 later): level 1 names request
    2, step 1 at position 4 + 1; both re-runs get the forced tokens and the forced requests; the
    trace ran in request order, the replay in the order [2, 0, 1] (request 2 is first there)."""
    tokens = [[7, 8, 9]] * 3
    trace = trace_of([steps(t) for t in tokens], speculative={"topk": 1})
    other = [-0.5, -1.0, -2.0]
    results = [result([7, 8, 9]), result([7, 8, 6]), result([7, 8, 9], other)]
    setup = Setup(checkpoint={"path": "elsewhere"}, max_batch=1, order=[2, 0, 1], speculative={"topk": 1})
    first = StepVerdict(2, 1, Verdict.BITS)
    assert rp._locate(trace, setup, requests(), tokens, results, first, "teacher-forced") == "located"
    (c,) = calls.located
    assert c.sides == ("the trace", "the replay")
    assert divergence(c.d) == (2, 1, 1, 5, False, ["logprob bits"])
    assert [(td.name, td.sides, td.first_flat, td.n_diff) for td in c.d.diffs] == [
        ("logprobs_2", ("the trace", "the replay"), 1, 1)]
    assert c.request_in == (2, 0)
    assert calls.runs == []                                   # nothing re-run before locate asks
    c.go_ref("trace A")
    c.go_other("trace B")
    (s_ref, r_ref, log_ref, f_ref, t_ref), (s_oth, r_oth, log_oth, f_oth, t_oth) = calls.runs
    assert s_ref == rp.recorded_setup(trace) and s_ref.order is None and s_oth is setup
    assert (log_ref, log_oth, t_ref, t_oth) == (None, None, "trace A", "trace B")
    assert f_ref is tokens and f_oth is tokens
    forced = [Request(p, SamplingParams(greedy=True, max_new_tokens=3, stop_token_ids=()), seed=None) for p in PROMPTS]
    assert r_ref == forced and r_oth == forced


def test_a_speculative_free_run_compares_accept_lengths(calls):
    """Same tokens and logprobs, request 1's accept lengths [1, 2] where the trace has [2, 1]: a
    divergence at verify round 1; the re-runs run free (no forced tokens, the requests as given),
    each side in request order."""
    tokens = [[7, 8, 9, 4]] * 2
    rounds = [[{"accept_length": 2}, {"accept_length": 1}]] * 2
    trace = trace_of([steps(t) for t in tokens], rounds=rounds, speculative={"topk": 1})
    results = [result(tokens[0], accept=[2, 1]), result(tokens[1], accept=[1, 2])]
    setup = Setup(checkpoint={"path": "x"}, speculative={"topk": 1})
    reqs = requests()[:2]
    rp._locate(trace, setup, reqs, tokens, results, StepVerdict(1, 1, Verdict.CONTROL), "free-run")
    (c,) = calls.located
    assert divergence(c.d) == (1, 1, 1, 3, True, ["accept lengths"])
    assert [(td.name, td.first_flat) for td in c.d.diffs] == [("accept_lengths_1", 0)]
    assert c.request_in == (1, 1)
    c.go_ref("A")
    c.go_other("B")
    assert [(r is reqs, f, t) for _, r, _, f, t in calls.runs] == [(True, None, "A"), (True, None, "B")]
    assert calls.runs[0][0].speculative == {"topk": 1} and calls.runs[1][0] is setup


@pytest.mark.parametrize("mode, speculative", [("free-run", None), ("teacher-forced", {"topk": 1})])
def test_accept_lengths_are_not_compared_outside_a_speculative_free_run(calls, mode, speculative):
    """The same accept-length difference, but the replay is not a speculative free run: tokens and
    logprobs agree, so level 1 is built from the first verdict (a routing or digest difference):
    its request and step, the position after that request's prompt, its status."""
    tokens = [[7, 8, 9, 4]] * 3
    rounds = [[{"accept_length": 2}, {"accept_length": 1}]] * 3
    trace = trace_of([steps(t) for t in tokens], rounds=rounds, speculative=speculative)
    results = [result(t, accept=[1, 2]) for t in tokens]
    setup = Setup(checkpoint={"path": "x"}, speculative=speculative, order=[1, 2, 0])
    rp._locate(trace, setup, requests(), tokens, results, StepVerdict(1, 2, Verdict.BITS, "routing"), mode)
    (c,) = calls.located
    assert divergence(c.d) == (1, 2, 2, 4, False, ["bits"]) and c.d.diffs == []
    assert c.request_in == (1, 0)
    c.go_other("B")
    assert calls.runs[0][3] == (None if mode == "free-run" else tokens)


def test_the_trace_side_reads_the_recorded_logprob_bits(calls):
    """The trace's logprobs are its recorded float32 bits: a replay off by one ULP is found."""
    tokens = [[7, 8, 9]]
    trace = trace_of([steps(tokens[0])])
    ulp = float(torch.tensor(LP[2], dtype=torch.float32).nextafter(torch.tensor(0.0)))
    results = [result(tokens[0], LP[:2] + [ulp])]
    rp._locate(trace, Setup(checkpoint={"path": "x"}), requests()[:1], tokens, results,
               StepVerdict(0, 2, Verdict.BITS), "free-run")
    (c,) = calls.located
    assert divergence(c.d) == (0, 2, 2, 5, False, ["logprob bits"])
