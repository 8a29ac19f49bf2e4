"""The locator on the Triton ops' fused path (issue 22): a traced forward runs the fused sublayer
ends, and a divergence planted in one op of that path is named by harness.locate.compare_traces
as the first op that differs, with every op before it bitwise equal."""

from __future__ import annotations

from dataclasses import replace

import torch

from lockstep.engine.model import GptOssModel
from lockstep.engine.ops import FusedEnds
from lockstep.engine.ops import TRITON_CPU as TRITON  # these models run on the CPU
from lockstep.engine.trace import OpTrace
from lockstep.harness.locate import compare_traces
from tests.engine.helpers import random_prompt
from tests.kernels.conftest import DEVICE


def _traced_prefill(model, prompt) -> OpTrace:
    model.trace = OpTrace()
    try:
        ints = lambda v: torch.tensor(v, dtype=torch.int64, device=DEVICE)   # noqa: E731
        model.forward(ints(prompt), ints(range(len(prompt))), ints([0] * len(prompt)), model.new_cache(1, len(prompt)))
        return model.trace
    finally:
        model.trace = None


def test_a_planted_attention_divergence_is_located_on_the_fused_path(tiny_ckpts):
    model = GptOssModel.from_checkpoint(tiny_ckpts["bf16"], backend="triton", device=DEVICE)
    prompt = random_prompt(5, seed=11)
    ends = []
    counted = FusedEnds(*[(lambda f: lambda *a: ends.append(f) or f(*a))(f)
                          for f in (TRITON.fused.rope_qkv_cache, TRITON.fused.row_parallel_residual,
                                    TRITON.fused.moe_residual)])

    layer1 = {}

    def nudged(q, k_cache, *args):
        """Layer 1's attention, every element one ulp up (the planted divergence)."""
        o = TRITON.attention(q, k_cache, *args)
        if k_cache.data_ptr() == layer1["k"]:
            o = torch.nextafter(o, torch.full_like(o, float("inf")))
        return o

    model.use_ops(replace(TRITON, fused=counted))
    reference = _traced_prefill(model, prompt)
    assert len(ends) == 3 * model.config.num_hidden_layers              # the traced forward is the fused one

    real_new_cache = model.new_cache

    def new_cache(*a):                                                   # remember layer 1's key cache
        cache = real_new_cache(*a)
        layer1["k"] = cache.k[1].data_ptr()
        return cache

    model.new_cache = new_cache
    model.use_ops(replace(TRITON, fused=counted, attention=nudged))
    other = _traced_prefill(model, prompt)
    o = compare_traces(reference, other, ("reference", "planted"))
    assert o.op is not None and o.op.name == "L1.attention", o.op
    assert o.boundary is not None and o.boundary.name == "boundary.2"
    assert o.equal_before == list(reference.ops).index("L1.attention")   # every op before it equal
