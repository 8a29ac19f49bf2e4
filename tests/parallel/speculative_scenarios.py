"""What every rank runs in the speculative D4 tests (launched rank processes import this module by name).

Two target + draft pairs (`PairPaths`):

    fitted     models/tiny-target + models/tiny-eagle3, the shipped pair: the draft has its own
               embedding and accepts several tokens a round, so accepted paths are copied back
               from scratch KV slots and the draft extends over several positions. The target
               splits at TP 2, EP 2 and 4, TP 2 × EP 2 (2 KV heads: no TP 4).
    parallel   the tiny-parallel target + a synthetic draft without embed_tokens: it reads the
               target's embedding, which a rank holds only a vocab shard of at TP > 1. Splits
               up to TP 8; a random draft accepts little.

Every pair runs both SPECS (a target-only tree and a rejection chain) on REQUESTS (greedy and
seeded). `run(pairs, keys)` runs engine.parallel's own rank function at each key's topology (the
launched world's size) and returns the bits; `reference(pair)` gives the one-device bits.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch

from lockstep.engine.distributed import ParallelContext, Topology
from lockstep.engine.generate import Request
from lockstep.engine.sampling import SamplingParams
from lockstep.engine.speculative import SpecParams

MODELS = Path(__file__).resolve().parents[2] / "models"

SPECS = {
    "tree": SpecParams(num_steps=3, topk=2, draft_token_num=6, verify="target-only"),
    "chain": SpecParams(num_steps=3, topk=1, draft_token_num=4, verify="rejection"),
}


class PairPaths(NamedTuple):
    target: str
    draft: str
    convention: str


def fitted_pair() -> PairPaths:
    return PairPaths(str(MODELS / "tiny-target"), str(MODELS / "tiny-eagle3"), "sglang")


def requests() -> list[Request]:
    """Prompts the fitted draft was fitted on (ids < 505 fit both targets). With the fitted pair,
    request 0 (greedy) accepts drafts in both SPECS, request 1 (seeded, nearly greedy) in the
    target-only tree, request 2 (seeded, hot: p and q both flat) in the rejection chain."""
    P = SamplingParams
    return [Request([301, 59, 396, 248, 367, 433, 371, 5], P(greedy=True, max_new_tokens=10)),
            Request([287, 360, 200, 489, 460, 215, 373, 180], P(temperature=0.2, max_new_tokens=10), seed=14),
            Request([301, 59, 396, 248, 367, 433, 371, 5], P(temperature=3.0, max_new_tokens=10), seed=-3)]


def bits(results) -> list[tuple]:
    """Everything D4 pins of a speculative result: tokens, finish reason, logprob bytes, accept lengths."""
    return [(r.tokens, r.finish_reason, r.logprobs.numpy().tobytes(), r.accept_lengths) for r in results]


def reference(pair: PairPaths) -> dict:
    """The one-device GptOssModel + draft, per SPECS entry."""
    from lockstep.engine.eagle3 import load_draft
    from lockstep.engine.model import GptOssModel
    from lockstep.engine.speculative import speculative_generate
    target = GptOssModel.from_checkpoint(pair.target)
    draft = load_draft(pair.draft, target, convention=pair.convention)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)            # as each launched rank: on a busy 2-core runner, idle
    try:                                # intra-op threads of these tiny ops only spin
        return {name: bits(speculative_generate(target, draft, requests(), spec)) for name, spec in SPECS.items()}
    finally:
        torch.set_num_threads(threads)


def run(pairs: dict[str, PairPaths], keys: list[tuple]) -> dict:
    """keys: (pair name, tp, ep) or (pair name, tp, ep, variant), variant a function name in
    wrong_orders that replaces engine.parallel.reduce_row_parallel while that key runs."""
    from lockstep.engine import parallel
    from tests.parallel import wrong_orders
    invariant = parallel.reduce_row_parallel
    out = {}
    for key in keys:
        name, tp, ep, variant = (tuple(key) + (None,))[:4]
        pair = pairs[name]
        parallel.reduce_row_parallel = getattr(wrong_orders, variant) if variant else invariant
        try:
            ctx = ParallelContext(Topology(tp, ep))
            run = parallel.TopologyRun(str(pair.target), Topology(tp, ep))
            out[key] = {spec_name: bits(parallel._speculative_rank(ctx, run, requests(), pair.draft,
                                                                   pair.convention, spec))
                        for spec_name, spec in SPECS.items()}
        finally:
            parallel.reduce_row_parallel = invariant
    return out


def accepting_requests(per_spec: dict) -> dict[str, list[int]]:
    """Per SPECS entry, the requests of which some round accepted a draft token."""
    return {name: [i for i, r in enumerate(results) if max(r[3], default=1) > 1] for name, results in per_spec.items()}


def first_difference(got: list[tuple], want: list[tuple]) -> str:
    """A readable account of the first request whose bits differ."""
    fields = ("tokens", "finish reason", "logprob bytes", "accept lengths")
    for i, (g, w) in enumerate(zip(got, want)):
        for f, a, b in zip(fields, g, w):
            if a != b:
                shown = (lambda v: torch.frombuffer(bytearray(v), dtype=torch.float32).tolist()) \
                    if f == "logprob bytes" else (lambda v: v)
                return f"request {i}: {f} {shown(a)} != one device's {shown(b)}"
    return "same bits" if len(got) == len(want) else f"{len(got)} results, one device has {len(want)}"
