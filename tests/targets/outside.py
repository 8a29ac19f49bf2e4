"""Small outside engines built from Lockstep's own engine, each with at most one planted difference:
what the judges of harness/targets/judge.py must tell apart (DESIGN §11). Each is a Target with
`generate` (seeded sampling, batches, chunked prefill) at a declared dtype policy and claims.

    faithful        no difference (at bf16: a correct bf16 engine, not bitwise the reference)
    seed-offset     samples with the request's seed + 1
    coin-position   the Gumbel coin keyed by the token's position + 1
    bf16-logprobs   reports logprobs rounded to bf16 (its forward and its tokens are right)
    batch-logprobs  logprobs depend on how many requests share the call
    window          its sliding window sees one key more than DESIGN §7 says
    block1-sinks    block 1's attention sinks off by one (a convention error in one block)
    crash           raises inside generate
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch

import lockstep.engine.sampling as sampling
from lockstep.engine.generate import generate
from lockstep.engine.model import GptOssModel
from lockstep.harness.target import CPU, Op, Target

PLANTS = ("faithful", "seed-offset", "coin-position", "bf16-logprobs", "batch-logprobs", "window", "block1-sinks",
          "crash")


@functools.lru_cache(maxsize=8)
def _model(checkpoint: str, dtype: str, plant: str) -> GptOssModel:
    model = GptOssModel.from_checkpoint(checkpoint, dtype=dtype)
    for block in model.blocks if plant == "window" else ():
        if block.attn.window:
            block.attn.window += 1
    if plant == "block1-sinks":
        model.blocks[1].attn.sinks = model.blocks[1].attn.sinks + 1.0
    return model


@contextlib.contextmanager
def _coin_at_next_position():
    real = sampling.gumbel_noise
    sampling.gumbel_noise = lambda seeds, positions, cols: real(seeds, positions + 1, cols)
    try:
        yield
    finally:
        sampling.gumbel_noise = real


def engine(plant: str = "faithful", dtype: str = "fp32", claims=frozenset()) -> Target:
    assert plant in PLANTS, plant

    def run(checkpoint, requests, capture=(), prefill_chunk=None, max_batch=8):
        if plant == "crash":
            raise RuntimeError("outside engine: CUDA error: an illegal memory access was encountered")
        if plant == "seed-offset":
            requests = [dataclasses.replace(r, seed=None if r.seed is None else r.seed + 1) for r in requests]
        model = _model(str(checkpoint), dtype, plant)
        with _coin_at_next_position() if plant == "coin-position" else contextlib.nullcontext():
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
                       "capture": Op(capture, (CPU,), "tests/targets/outside.py: its model's boundary states")},
                  missing={"generate:capture": "the outside engine exposes no hidden states"},
                  dtype=dtype, claims=frozenset(claims))
