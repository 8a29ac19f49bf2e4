"""myengine as a Lockstep target: the operations Lockstep's spec kinds drive, wrapping the engine.

Registered in pyproject.toml under the entry point group `lockstep.targets`. Each operation is
optional; the features an Op declares say which specs it can run (harness/targets/base.py).
"""

from __future__ import annotations

import functools
from importlib.metadata import version
from pathlib import Path

import myengine
from lockstep.harness.targets import Op, Result, Target
from lockstep.harness.targets.base import CPU, CUDA


@functools.lru_cache(maxsize=4)
def _model(checkpoint: str):
    return myengine.load(checkpoint)


def _requests(requests) -> list:
    """Lockstep's requests (engine.request.Request) as myengine's own."""
    return [myengine.SamplingRequest(prompt=r.prompt, seed=r.seed,
                                     sampling=r.params.to_dict() | {"greedy": r.params.is_greedy}) for r in requests]


def generate(checkpoint, requests, capture=(), prefill_chunk=None, max_batch=8):
    results = myengine.generate(_model(str(checkpoint)), _requests(requests))
    return [Result(r.tokens, r.logprobs, r.finish_reason) for r in results]


def speculative_generate(checkpoint, draft_dir, convention, requests, speculative):
    results = myengine.speculative(_model(str(checkpoint)), str(draft_dir), convention, _requests(requests),
                                   **speculative)
    return [Result(r.tokens, r.logprobs, r.finish_reason, accept_lengths=list(r.accept_lengths)) for r in results]


def eagle3_layers(draft_config, convention, num_layers, fc_in, hidden, name, direct_ids=False):
    return myengine.aux_layers(draft_config, num_layers, fc_in // hidden)


def target() -> Target:
    where = (CPU, CUDA)
    return Target(
        name="myengine", version=version("myengine"),
        description="myengine: batched seeded sampling and EAGLE3 speculative decoding",
        ops={"generate": Op(generate, where, "myengine.generate", frozenset({"sampling", "batch"})),
             "speculative_generate": Op(speculative_generate, where, "myengine.speculative",
                                        frozenset({"sampling", "batch", "greedy", "target-only", "rejection",
                                                   "tree"})),
             "eagle3_layers": Op(eagle3_layers, where, "myengine.aux_layers")},
        missing={"generate:capture": "myengine does not expose hidden states",
                 "generate:prefill_chunk": "myengine prefills in one chunk"},
        conventions=("boundary",),
        refusals=(myengine.EngineConfigError,),          # its own refusals are clean errors, not crashes
        expectations=str(Path(__file__).with_name("lockstep-expectations.yaml")))
