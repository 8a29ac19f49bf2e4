"""Small outside engines built from Lockstep's own engine, each with at most one planted difference:
what the judges of harness/targets/judge.py must tell apart (DESIGN §11). Each is a Target with
`generate` (seeded sampling, batches, chunked prefill) at a declared dtype policy and claims, and
`sampling` with params (its sampler on given logits), declaring the coin contract (RNG_COINS).

    faithful        no difference (at bf16: a correct bf16 engine, not bitwise the reference)
    seed-offset     samples with the request's seed + 1
    coin-position   the Gumbel coin keyed by the token's position + 1
    bf16-logprobs   reports logprobs rounded to bf16 (its forward and its tokens are right)
    batch-logprobs  logprobs depend on how many requests share the call
    window          its sliding window sees one key more than DESIGN §7 says
    block1-sinks    block 1's attention sinks off by one (a convention error in one block)
    crash           raises inside generate
    tie-order       top-k / top-p ties at the cut kept highest id first (DESIGN §5: lowest first)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch

import lockstep.engine.sampling as sampling
from lockstep.engine.generate import generate
from lockstep.engine.model import GptOssModel
from lockstep.harness.target import CPU, RNG_COINS, Op, Target
from lockstep.kernels import portable
from lockstep.kernels.sampling import gumbel_argmax_torch

PLANTS = ("faithful", "seed-offset", "coin-position", "bf16-logprobs", "batch-logprobs", "window", "block1-sinks",
          "crash", "tie-order")


@functools.lru_cache(maxsize=8)
def _model(checkpoint: str, dtype: str, plant: str) -> GptOssModel:
    model = GptOssModel.from_checkpoint(checkpoint, dtype=dtype)
    for block in model.blocks if plant == "window" else ():
        if block.attn.window:
            block.attn.window += 1
    if plant == "block1-sinks":
        model.blocks[1].attn.sinks = model.blocks[1].attn.sinks + 1.0
    return model


def _keep_ties_to_higher_ids(z, top_k, top_p, min_p):
    """engine.sampling.keep_mask_rows with equal probabilities ranked highest id first (the planted
    tie order): the same filters, the same sums, only the sort's order among equals reversed."""
    R, V = z.shape
    probs = portable.softmax(z, dim=-1)
    sorted_p, flipped = torch.sort(probs.flip(-1), dim=-1, descending=True, stable=True)
    order = V - 1 - flipped
    keep_sorted = torch.ones((R, V), dtype=torch.bool)
    if top_k is not None:
        keep_sorted &= torch.arange(V)[None, :] < top_k[:, None]
    if top_p is not None:
        exclusive = torch.cat([sorted_p.new_zeros(R, 1), portable.prefix_sum(sorted_p, dim=-1)[:, :-1]], dim=-1)
        keep_sorted &= (exclusive < top_p[0, :, None]) | (top_p[1, :, None] == 1.0)
    keep = torch.empty((R, V), dtype=torch.bool)
    keep[torch.arange(R)[:, None], order] = keep_sorted
    if min_p is not None:
        keep &= (probs >= min_p[0, :, None] * sorted_p[:, :1]) | (min_p[1, :, None] == 1.0)
    return keep


@contextlib.contextmanager
def _planted(plant: str):
    """The engine's sampler with the plant's difference (coin position, tie order) while inside."""
    saved = sampling.gumbel_noise, sampling.keep_mask_rows
    if plant == "coin-position":
        sampling.gumbel_noise = lambda seeds, positions, cols: saved[0](seeds, positions + 1, cols)
    if plant == "tie-order":
        sampling.keep_mask_rows = _keep_ties_to_higher_ids
    try:
        yield
    finally:
        sampling.gumbel_noise, sampling.keep_mask_rows = saved


def _sampler(plant: str):
    """sampling(logp, seeds, positions) Gumbel-max, or with params= the engine's sampler on logits."""
    def sample(logp, seeds, positions, params=None):
        seeds = seeds + 1 if plant == "seed-offset" else seeds
        if params is None:
            return gumbel_argmax_torch(logp, seeds, positions + 1 if plant == "coin-position" else positions)
        with _planted(plant):
            return sampling.sample_rows(logp, list(params), seeds.tolist(), positions.tolist())
    return sample


def engine(plant: str = "faithful", dtype: str = "fp32", claims=frozenset()) -> Target:
    assert plant in PLANTS, plant

    def run(checkpoint, requests, capture=(), prefill_chunk=None, max_batch=8):
        if plant == "crash":
            raise RuntimeError("outside engine: CUDA error: an illegal memory access was encountered")
        if plant == "seed-offset":
            requests = [dataclasses.replace(r, seed=None if r.seed is None else r.seed + 1) for r in requests]
        model = _model(str(checkpoint), dtype, plant)
        with _planted(plant):
            results = generate(model, requests, prefill_chunk=prefill_chunk, max_batch=max_batch)
        for r in results:
            if plant == "bf16-logprobs":
                r.logprobs = r.logprobs.to(torch.bfloat16).to(torch.float32)
            if plant == "batch-logprobs":
                r.logprobs = r.logprobs + 2.0 ** -20 * (len(requests) - 1)
        return results

    def capture(checkpoint, prompt, boundaries):
        model, T = _model(str(checkpoint), dtype, plant), len(prompt)
        return model.forward(torch.tensor(prompt), torch.arange(T), torch.zeros(T, dtype=torch.int64),
                             model.new_cache(1, T), capture=boundaries).captured

    return Target(f"outside-{plant}", "1.0", description=f"Lockstep's engine with a planted difference: {plant}",
                  ops={"generate": Op(run, (CPU,), "tests/targets/outside.py",
                                      frozenset({"sampling", "batch", "prefill_chunk"})),
                       "capture": Op(capture, (CPU,), "tests/targets/outside.py: its model's boundary states"),
                       "sampling": Op(_sampler(plant), (CPU,), "tests/targets/outside.py", frozenset({"params"}))},
                  missing={"generate:capture": "the outside engine exposes no hidden states"},
                  dtype=dtype, claims=frozenset(claims), rng=RNG_COINS)
