"""The dtype policies (engine.model): bf16 storage with fp32 accumulation, MXFP4 kept packed.

Each property is checked on the device the kernels are tested on (tests.kernels.conftest.DEVICE:
the GPU when there is one, else the CPU with Triton's interpreter), for both deterministic
backends, bitwise:
  * what the bf16 policy stores in bf16 and what stays fp32;
  * a request's bits do not depend on its batchmates (D2) or on prefill vs decode (D3);
  * MXFP4 experts kept packed give exactly the bits of the same experts dequantized at load.
"""

from __future__ import annotations

import pytest
import torch

from lockstep.engine.checkpoint import load_checkpoint
from lockstep.engine.model import GptOssModel
from lockstep.engine.mxfp4 import Mxfp4Weight
from tests.engine.helpers import random_prompt
from tests.kernels.conftest import DEVICE

BACKENDS = ["torch", "triton"]
# one xdist worker runs the module (pyproject --dist loadgroup), so the forwards its tests share
# (the `forward` fixture) are computed once a run, not once on each worker
pytestmark = pytest.mark.xdist_group("dtype-policy")


def _model(ckpt, backend, dtype, packed=True):
    config, weights = load_checkpoint(ckpt, packed_mxfp4=packed)
    return GptOssModel(config, weights, backend=backend, device=DEVICE, dtype=dtype)


def _run(model, requests, capture=(1,)):
    """Prefill several requests in ONE forward (each in its own slot) -> (logits, captured)."""
    toks, pos, slots = [], [], []
    for s, prompt in enumerate(requests):
        toks += prompt
        pos += range(len(prompt))
        slots += [s] * len(prompt)
    cache = model.new_cache(len(requests), max(map(len, requests)))
    out = model.forward(torch.tensor(toks), torch.tensor(pos), torch.tensor(slots), cache, capture=capture)
    return out.logits, out.captured


@pytest.fixture(scope="module")
def forward(tiny_ckpts):
    """forward(fmt, backend, dtype, requests, packed=True, capture=(1,)) -> `_run` on a fresh model,
    computed once per module: under Triton's interpreter a forward costs seconds, and several tests
    compare against the same one (a request alone: the batch test and prefill-vs-decode; the packed
    MXFP4 experts: the packed-vs-dequantized test and the fused-ends test)."""
    done = {}

    def run(fmt, backend, dtype, requests, packed=True, capture=(1,)):
        key = (fmt, backend, dtype, tuple(map(tuple, requests)), packed, capture)
        if key not in done:
            done[key] = _run(_model(tiny_ckpts[fmt], backend, dtype, packed), requests, capture)
        return done[key]
    return run


# The requests: A alone and inside [B, A, C] (A is rows 12-18 of 22 there: it straddles row 16),
# and A's first tokens decoded one by one; P (two requests) through the packed MXFP4 experts,
# fused and unfused.
A, B, C = random_prompt(7, 2), random_prompt(12, 3), random_prompt(3, 4)
P = [random_prompt(6, 8), random_prompt(3, 9)]


def test_bf16_policy_stores_bf16_and_returns_fp32_logits(tiny_ckpts):
    m = _model(tiny_ckpts["bf16"], "torch", "bf16")
    assert m.embed.dtype == m.lm_head.dtype == m.blocks[0].attn.qkv_w.dtype == torch.bfloat16
    assert m.blocks[0].attn.norm.dtype == m.blocks[0].attn.sinks.dtype == torch.float32
    assert m.new_cache(1, 8).k[0].dtype == torch.bfloat16
    logits, captured = _run(m, [random_prompt(6, 1)])
    assert logits.dtype == torch.float32 and captured.dtype == torch.bfloat16
    fp32 = _run(_model(tiny_ckpts["bf16"], "torch", "fp32"), [random_prompt(6, 1)])[0]
    assert not torch.equal(logits, fp32)                        # the policy changes the computation
    assert (logits - fp32).abs().max() < 0.25                    # ... but not the model


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_request_alone_equals_it_inside_a_batch(forward, backend, dtype):
    alone = forward("bf16", backend, dtype, [A])
    logits, captured = forward("bf16", backend, dtype, [B, A, C])   # every kernel's positions: tests/kernels
    assert torch.equal(logits[len(B):len(B) + len(A)], alone[0])
    assert torch.equal(captured[len(B):len(B) + len(A)], alone[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_prefill_equals_decode(tiny_ckpts, forward, backend):
    """A's first four tokens decoded one by one give the first four rows of A's prefill (the batch
    test's): positions 0-3, the first with an empty cache (a decode step costs a forward's launches,
    ~1 s under Triton's interpreter, whatever its one row)."""
    m = _model(tiny_ckpts["bf16"], backend, "bf16")
    full = forward("bf16", backend, "bf16", [A])[0]
    cache = m.new_cache(1, len(A))
    steps = [m.forward(torch.tensor([t]), torch.tensor([p]), torch.tensor([0]), cache).logits
             for p, t in enumerate(A[:4])]
    assert torch.equal(torch.cat(steps), full[:4])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_packed_mxfp4_experts_equal_dequantized_ones(tiny_ckpts, forward, backend, dtype):
    for packed, kind in ((True, Mxfp4Weight), (False, torch.Tensor)):
        assert isinstance(_model(tiny_ckpts["mxfp4"], backend, dtype, packed).blocks[0].mlp.held.gate_up_w, kind)
    packed = forward("mxfp4", backend, dtype, P, capture=(1, 4))
    dense = forward("mxfp4", backend, dtype, P, packed=False, capture=(1, 4))
    assert torch.equal(packed[0], dense[0]) and torch.equal(packed[1], dense[1])


def test_bad_policy_or_backend_is_refused(tiny_ckpts):
    config, weights = load_checkpoint(tiny_ckpts["bf16"])
    with pytest.raises(ValueError, match="dtype policy"):
        GptOssModel(config, weights, dtype="fp16")
    with pytest.raises(ValueError, match="backend"):
        GptOssModel(config, weights, backend="cublas")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_triton_fused_sublayer_ends_equal_the_unfused_ops(tiny_ckpts, forward, dtype):
    """The Triton forward ends each sublayer in one kernel (the ops table's `fused`); the same ops
    without them go op by op. Both give the same bits, untraced and traced, and a traced forward
    runs the fused kernels too (the trace records the same points, every one bitwise equal)."""
    from dataclasses import replace

    from lockstep.engine.ops import FusedEnds
    from lockstep.engine.trace import OpTrace
    m = _model(tiny_ckpts["mxfp4"], "triton", dtype)
    TRITON = m.ops                                                     # the triton table of this device
    calls = []
    counted = FusedEnds(*[(lambda f: lambda *a: calls.append(f) or f(*a))(f)
                          for f in (TRITON.fused.rope_qkv_cache, TRITON.fused.row_parallel_residual,
                                    TRITON.fused.moe_residual)])

    def traced(ops):
        m.use_ops(ops)
        m.trace = OpTrace()
        try:
            return _run(m, P, capture=(1, 4)), m.trace
        finally:
            m.trace = None
            m.use_ops(TRITON)

    fused = forward("mxfp4", "triton", dtype, P, capture=(1, 4))    # the packed-vs-dequantized test's
    (fused_traced, fused_trace) = traced(replace(TRITON, fused=counted))
    assert len(calls) == 3 * m.config.num_hidden_layers                # the traced forward ran every fused end
    (unfused, unfused_trace) = traced(replace(TRITON, fused=None))
    for a, b in ((fused, unfused), (fused_traced, unfused)):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert list(fused_trace.ops) == list(unfused_trace.ops) and "L0.o_proj" in fused_trace.ops
    for name, b in unfused_trace.ops.items():
        a = fused_trace.ops[name]
        assert a.dtype == b.dtype and a.contiguous().view(torch.uint8).equal(b.contiguous().view(torch.uint8)), name
