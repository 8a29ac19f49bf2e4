"""What every rank runs in the D4 tests (launched rank processes import this module by name).

`run(ckpt, topologies, variant)` builds the parallel model at each topology (all of the
launched world's size) and returns, per topology, the bits of a fixed set of generate and
forward calls; `reference(ckpt)` returns the same from the one-device GptOssModel.
"""

from __future__ import annotations

import torch

from lockstep.engine.generate import Request, generate
from lockstep.engine.sampling import SamplingParams

CAPTURE = [0, 1, 2]


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 505, (n,), generator=g).tolist()


def requests() -> list[Request]:
    P = SamplingParams
    return [Request(_prompt(30, 1), P(greedy=True, max_new_tokens=6)),          # crosses KV tile 32
            Request(_prompt(11, 2), P(temperature=0.8, top_k=40, max_new_tokens=6), seed=7),
            Request(_prompt(5, 3), P(temperature=1.2, top_p=0.9, max_new_tokens=5), seed=123)]


def bits(results) -> list[tuple]:
    return [(r.tokens, r.finish_reason, r.logprobs.numpy().tobytes(), r.captured.numpy().tobytes())
            for r in results]


def forward_bits(model) -> tuple[bytes, bytes]:
    """One mixed-batch prefill: full logits and boundary states as bytes."""
    toks = _prompt(20, 9)
    cache = model.new_cache(2, 32)
    out = model.forward(torch.tensor(toks), torch.tensor(list(range(12)) + list(range(8))),
                        torch.tensor([0] * 12 + [1] * 8), cache, capture=CAPTURE)
    return out.logits.numpy().tobytes(), out.captured.numpy().tobytes()


def workload(model, d2_d3: bool = False) -> dict:
    out = {"forward": forward_bits(model), "generate": bits(generate(model, requests(), capture=CAPTURE))}
    if d2_d3:
        reqs = requests()
        out["alone"] = [bits(generate(model, [r], capture=CAPTURE))[0] for r in reqs]
        out["shuffled_chunked"] = bits(generate(model, reqs[::-1], capture=CAPTURE, max_batch=2, prefill_chunk=3))[::-1]
    return out


def reference(ckpt: str) -> dict:
    from lockstep.engine.model import GptOssModel
    return workload(GptOssModel.from_checkpoint(ckpt))


def run(ckpt: str, topologies: list[tuple], d2_d3: bool = False) -> dict:
    """topologies: (tp, ep) or (tp, ep, variant), variant a function name in wrong_orders that
    replaces engine.parallel.reduce_row_parallel for that model (None: the invariant one)."""
    from lockstep.engine import parallel
    from lockstep.engine.checkpoint import load_checkpoint
    from lockstep.engine.distributed import ParallelContext, Topology
    from lockstep.engine.model import GptOssModel
    from tests.parallel import wrong_orders
    config, weights = load_checkpoint(ckpt)
    invariant = parallel.reduce_row_parallel
    results = {}
    for key in topologies:
        tp, ep, variant = (tuple(key) + (None,))[:3]
        parallel.reduce_row_parallel = getattr(wrong_orders, variant) if variant else invariant
        try:
            ctx = ParallelContext(Topology(tp, ep))
            model = parallel.shard(GptOssModel(config, weights), ctx)
            results[key] = workload(model, d2_d3=d2_d3 and variant is None)
            results["transport"] = ctx.transport
        finally:
            parallel.reduce_row_parallel = invariant
    results["invariant_sum"] = invariant_sum_bits()
    return results


def sum_partials() -> list[torch.Tensor]:
    """8 partials of an odd shape (the scatter path pads), values where the order shows."""
    g = torch.Generator().manual_seed(5)
    return [torch.randn(3, 1001, generator=g) * 10.0 ** (c % 4) for c in range(8)]


def invariant_sum_bits() -> dict:
    """lockstep.engine.distributed.invariant_sum over the whole world, both algorithms."""
    import torch.distributed as dist
    from lockstep.engine.distributed import invariant_sum
    world, rank = dist.get_world_size(), dist.get_rank()
    per = 8 // world
    mine = sum_partials()[rank * per:(rank + 1) * per]
    return {alg: invariant_sum(mine, world, None, alg).numpy().tobytes() for alg in ("gather", "scatter")}
