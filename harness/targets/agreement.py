"""The calibrated judge: another engine's free-running tokens and logprobs against the reference
at the engine's declared dtype policy (DESIGN §11, docs/targets.md "The calibrated judge").

For each request the reference scores the engine's own tokens teacher-forced
(lockstep.engine.generate.score), which gives per step the reference's logprob of that token, the
token the reference itself would choose there and how close that choice was (its margin):
- a step where the engine took another token than the reference's choice is a **near-tie** when
  the reference's margin is within the bound (allowed, reported, and judging goes on teacher-forced
  from the engine's token), and a **divergence** otherwise: the spec fails at that step;
- logprobs are compared as a distribution over every scored token (p50 / p99 / max of |Δ|), and
  fail where the largest exceeds the bound;
- a stop the reference would not take there (or a stop id the engine ran past) is a control-flow
  divergence.
A divergence is classified: **sampler** when the engine's logprobs up to that step agree with the
reference's within the bound (bit for bit: "the forward is bit-exact"), **forward** otherwise;
logprobs beyond the bound where every token agrees are **logprobs** (the forward or the logprob
computation). Where the engine captures boundary states (its `capture` operation), the first
forward or logprobs failure is placed by the layer locator (harness/targets/locator.py): in a block
(then it is **forward**, whatever the tokens did), or in none (the head or the logprobs).
The first line of a failure is the cause: judge, class, request and step; its float details come
after " — ", so an expectations file matches the part before it (harness/targets/expectfile.py).
Where the engine's `sampling` takes params under the coin contract, the exact sampler judge
(`exact_sampler`) runs it on the reference's logits of every step of each seeded request: its
tokens must be DESIGN §5's bit for bit, and its failures lead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lockstep.engine.generate import score
from lockstep.engine.sampling import broken_rule, sample_rows, seed_as_int64, settings_phrase
from lockstep.harness.targets.bounds import Bound

JUDGE = "agreement"
DETAIL = " — "               # a headline's cause comes before it, its numbers after it


@dataclass
class RequestVerdict:
    request: int
    failure: str | None = None          # the headline of this request's first failure
    near_ties: list[str] = field(default_factory=list)
    deltas: torch.Tensor | None = None  # |Δ logprob| of every scored token, float64
    cls: str = ""                       # the failure's class: sampler, forward, logprobs, control flow
    step: int = 0                       # the step it happened at


def settings(req) -> str:
    """The request's sampling settings in one phrase (what a reader needs to reproduce its draw)."""
    return settings_phrase(req.params, req.seed)


def exact_sampler(i: int, req, scored, sampler) -> str | None:
    """The exact sampler judge: the engine's `sampling` operation (with params) on the reference's
    own logits of every step of seeded request i must draw DESIGN §5's tokens, bit for bit (no
    bound: the sampler is a contract). The first step it does not, cause first; None if none."""

    n = len(scored.tokens)
    if req.params.is_greedy or req.seed is None or scored.logits is None or not n:
        return None
    params, seeds = [req.params] * n, [req.seed] * n
    want = sample_rows(scored.logits, params, seeds, scored.positions).tolist()
    got = [int(t) for t in sampler(scored.logits, torch.tensor([seed_as_int64(req.seed)] * n, dtype=torch.int64),
                                   torch.tensor(scored.positions, dtype=torch.int64), params=params).tolist()]
    k = next((k for k in range(n) if got[k] != want[k]), None)
    if k is None:
        return None
    pos = scored.positions[k]
    return (f"sampler: {broken_rule(scored.logits[k], req.params, req.seed, pos, got[k])} at request {i} step {k} "
            f"(position {pos}; {settings(req)}){DETAIL}token {got[k]} where DESIGN §5 gives {want[k]} on the "
            f"reference's logits (the engine's sampling operation, teacher-forced)")


def judge_request(i: int, req, tokens: list[int], logprobs: torch.Tensor, scored, bound: Bound,
                  stop_ids: set[int]) -> RequestVerdict:
    """One request of the engine against the reference's teacher-forced score of its tokens."""
    v = RequestVerdict(i)
    n = len(scored.tokens)
    ours = torch.as_tensor(logprobs, dtype=torch.float32)[:n].double()
    ref = scored.logprobs[:n].double()
    v.deltas = (ours - ref).abs().nan_to_num(nan=float("inf"))
    for k in range(n):
        if tokens[k] == scored.choice[k]:
            continue
        m = scored.margin[k]
        where = f"request {i} step {k}"
        if m <= bound.near_tie:
            v.near_ties.append(f"{where}: token {tokens[k]} where the reference chooses {scored.choice[k]} "
                               f"(a near-tie: margin {m:.3g} <= {bound.near_tie:.3g})")
            continue
        v.cls, v.step = _class(v.deltas[:k + 1], bound), k
        v.failure = (f"{JUDGE}: {v.cls} at {where}{DETAIL}token {tokens[k]} where the reference chooses "
                     f"{scored.choice[k]} (margin {m:.3g} > near-tie bound {bound.near_tie:.3g}; "
                     f"{settings(req)}){_exact(v.deltas[:k + 1])}")
        return v
    if n < len(tokens):
        v.failure = (f"{JUDGE}: control flow at request {i} step {n - 1}{DETAIL}the engine went on past stop id "
                     f"{tokens[n - 1]} ({len(tokens)} tokens where the reference stops at {n})")
        return v
    if tokens and tokens[-1] not in stop_ids and len(tokens) < req.params.max_new_tokens:
        v.failure = (f"{JUDGE}: control flow at request {i} step {n}{DETAIL}the engine stopped after {n} of "
                     f"{req.params.max_new_tokens} tokens on {tokens[-1]}, not a stop id")
        return v
    bad = (v.deltas > bound.logprob).nonzero()
    if len(bad):                # every token agrees: the forward, or how the logprobs are computed
        k = int(bad[0])
        v.cls, v.step = "logprobs", k
        v.failure = (f"{JUDGE}: logprobs at request {i} step {k}{DETAIL}logprob {float(ours[k]):.9g} where the "
                     f"reference scores {float(ref[k]):.9g} (|Δ| {float(v.deltas[k]):.3g} > bound "
                     f"{bound.logprob:.3g}; every token agrees with the reference's choice)")
    return v


def _class(deltas: torch.Tensor, bound: Bound) -> str:
    return "sampler" if bool((deltas <= bound.logprob).all()) else "forward"


def _exact(deltas: torch.Tensor) -> str:
    return "; the forward is bit-exact up to here" if bool((deltas == 0).all()) else ""


def distribution(deltas: list[torch.Tensor]) -> dict:
    """p50 / p99 / max of |Δ logprob| over every scored token of a spec."""
    d = torch.cat([x for x in deltas if x is not None and x.numel()]) if any(
        x is not None and x.numel() for x in deltas) else torch.zeros(1, dtype=torch.float64)
    d = d.nan_to_num(posinf=1e300)
    q = torch.quantile(d, torch.tensor([0.5, 0.99], dtype=torch.float64)).tolist()
    return {"p50": q[0], "p99": q[1], "max": float(d.max()), "tokens": int(d.numel())}


def judge(requests, results, reference, bound: Bound, locate=None, sampler=None) -> tuple[list[str], list[str], dict]:
    """(failures, cause first; notes: near-ties and the logprob distribution; the distribution).
    `locate(tokens) -> (block phrase, note)`, where the engine exposes captured states, places the
    first forward or logprobs failure in a block (harness/targets/locator.py). `sampler`: the
    engine's `sampling` operation with params, where it declares the coin contract: the exact
    sampler judge runs on every seeded request, and its failures lead."""

    stop = set(reference.config.eos_token_id)
    exact, fails, notes, deltas = [], [], [], []
    for i, (req, res) in enumerate(zip(requests, results)):
        tokens = list(res.tokens)
        if not tokens:
            continue
        seeded = sampler is not None and req.seed is not None and not req.params.is_greedy
        scored = score(reference, [req], [tokens], keep_logits=seeded)[0]
        if seeded:
            exact += [f for f in [exact_sampler(i, req, scored, sampler)] if f]
        ids = set(req.params.stop_token_ids) if req.params.stop_token_ids else stop
        v = judge_request(i, req, tokens, res.logprobs, scored, bound, ids)
        deltas.append(v.deltas)
        notes += v.near_ties
        if v.failure and locate is not None and v.cls in ("forward", "logprobs") and not fails:
            block, note = locate(list(req.prompt) + tokens[:v.step])
            cls = "forward" if block.startswith(("block", "the embedding")) else v.cls   # the states tell
            v.failure = v.failure.replace(f"{JUDGE}: {v.cls} at", f"{JUDGE}: {cls} ({block}) at", 1)
            notes.append(note)
        if v.failure:
            fails.append(v.failure)
    fails = exact + fails
    dist = distribution(deltas)
    for q in ("p50", "p99"):
        if dist[q] > getattr(bound, q):
            fails.append(f"{JUDGE}: logprobs {q} over the spec{DETAIL}{dist[q]:.3g} > bound {getattr(bound, q):.3g} "
                         f"at {bound.dtype} ({dist['tokens']} tokens teacher-forced)")
    notes.append(f"{JUDGE}: logprobs teacher-forced over {dist['tokens']} tokens: p50 {dist['p50']:.3g}, "
                 f"p99 {dist['p99']:.3g}, max {dist['max']:.3g} (bounds {bound.p50:.3g} / {bound.p99:.3g} / "
                 f"{bound.logprob:.3g} at {bound.dtype}; near-tie margin {bound.near_tie:.3g})")
    return fails, notes, dist
