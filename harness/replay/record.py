"""`lockstep record`: run requests through the engine and write what happened as a trace.

A recording is two runs of the same batch:
  1. the run itself (plain or speculative), observed through engine.trace's events: each token
     and its logprob bits, and per verify round the draft tree, the accepted nodes and the bonus
     (or correction) token;
  2. a teacher-forced run of the same tokens that observes each step's logits row (digest,
     top-1/top-2 margin) and the routed experts of every layer. The two runs must agree on every
     logprob bit (D3: a position's logits do not depend on how it was computed); if they do not,
     nothing is written and the first disagreeing request and step are named.
"""

from __future__ import annotations

from pathlib import Path

from lockstep.engine.request import Request
from lockstep.harness.platform import lockstep_revision, versions
from lockstep.harness.replay.format import FORMAT, TRACE_VERSION, Trace, TraceError, f32_bits, write_trace
from lockstep.harness.replay.identity import checkpoint_identity, platform_identity
from lockstep.harness.replay.observe import StepLog
from lockstep.harness.replay.run import Setup, checkpoint_folder, draft_folder, forced_requests, run

RNG_LOCKSTEP = "lockstep-coins-1"      # DESIGN §5: murmur3(seed, pos, column) Gumbel-max and verify coins
RNG_GREEDY = "none (greedy)"


def engine_identity() -> dict:
    return {"name": "lockstep", "revision": lockstep_revision(), **versions()}


def record(setup: Setup, requests: list[Request]) -> Trace:
    for i, r in enumerate(requests):
        if r.seed is None and not r.params.is_greedy:
            raise TraceError(f"request {i}: sampled without a seed; a recording must be reproducible "
                             f"(give it a seed, or make it greedy)")
    log = StepLog([len(r.prompt) for r in requests])
    results = run(setup, requests, log)
    tokens = [list(r.tokens) for r in results]
    flog = StepLog([len(r.prompt) for r in requests], logits=True)
    forced = run(Setup(**{**setup.__dict__, "speculative": None}), forced_requests(requests, tokens), flog, tokens)
    for i, (a, b) in enumerate(zip(results, forced)):
        bits_a = [f32_bits(float(x)) for x in a.logprobs]
        bits_b = [f32_bits(float(x)) for x in b.logprobs]
        if bits_a != bits_b:
            k = next(k for k in range(len(bits_a)) if bits_a[k] != bits_b[k])
            raise TraceError(f"request {i}, token {k}: the run's logprob bits {bits_a[k]} differ from the "
                             f"teacher-forced recomputation's {bits_b[k]} (D3 broken); nothing written")
    return build_trace(setup, requests, results, log, flog, source="lockstep")


def manifest(setup: Setup, n_requests: int, source: str) -> dict:
    m = {"format": FORMAT, "version": TRACE_VERSION, "source": source, "engine": engine_identity(),
         "settings": {**setup.settings(), "mode": "speculative" if setup.speculative else "generate"},
         "platform": platform_identity(setup.dtype, setup.backend, setup.device),
         "checkpoint": {"ref": setup.checkpoint, **checkpoint_identity(checkpoint_folder(setup))},
         "draft": None, "speculative": setup.speculative, "requests": n_requests}
    if setup.draft is not None:
        m["draft"] = {"ref": setup.draft, **checkpoint_identity(draft_folder(setup))}
    return m


def build_trace(setup: Setup, requests, results, log: StepLog, flog: StepLog, source: str) -> Trace:
    reqs, steps, rounds = [], [], []
    for i, (req, res) in enumerate(zip(requests, results)):
        reqs.append({"index": i, **req.to_dict(),
                     "rng": RNG_GREEDY if req.params.is_greedy else RNG_LOCKSTEP,
                     "eagle3": None if setup.speculative is None else {"draft": setup.draft, **setup.speculative},
                     "finish_reason": res.finish_reason, "tokens": len(res.tokens)})
        steps.append([step_record(i, k, tok, float(res.logprobs[k]), flog) for k, tok in enumerate(res.tokens)])
        rounds.append([round_record(i, r, n, log) for r, n in enumerate(getattr(res, "accept_lengths", None) or [], 1)])
    return Trace(manifest(setup, len(requests), source), reqs, steps, rounds)


def step_record(i: int, k: int, tok: int, logprob: float, flog: StepLog) -> dict:
    s = flog.logits.get((i, k), {})
    ex = flog.experts.get((i, k), {})
    return {"request": i, "step": k, "token": tok, "logprob": logprob, "logprob_bits": f32_bits(logprob),
            "margin": s.get("margin"), "margin_bits": s.get("margin_bits"), "logits_sha256": s.get("logits_sha256"),
            "experts": [ex[layer] for layer in sorted(ex)]}


def round_record(i: int, r: int, accept_length: int, log: StepLog) -> dict:
    ev = log.events.get((i, r), {})
    verify = ev.get("verify", [])
    return {"request": i, "round": r, "draft_tokens": ev.get("draft.tokens"), "draft_parents": ev.get("draft.parents"),
            "accepted": verify[:-1], "accept_length": accept_length, "bonus": verify[-1] if verify else None}


def write(trace: Trace, path: str | Path) -> Path:
    return write_trace(trace, path)
