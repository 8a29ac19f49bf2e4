"""The engine on the triton backend (tiny preset): D1/D2/D3 bitwise, close to the torch backend.

The triton-backend model (weights, KV cache, activations) lives on DEVICE; the torch-backend
reference on the CPU. Bitwise checks compare triton runs with each other, all on DEVICE."""

import pytest
import torch

from dataclasses import replace

from lockstep.engine.model import GptOssModel
from lockstep.engine.ops import TRITON_CPU as TRITON  # these models run on the CPU
from lockstep.engine.trace import OpTrace
from tests.engine.helpers import random_prompt
from lockstep.kernels.matmul import linear_triton
from lockstep.kernels.moe import clamped_swiglu_triton
from tests.kernels.conftest import DEVICE

T = 10
# The request of both tests: prefilled in two chunks, the second (4, 7) on a cached prefix, then
# decoded a token a step across the sliding window (8), in slot 1 of 2 beside another request that
# joins its first chunk (D2 and D3 at once for the first test; for the second, grouped launches
# with several rows an expert, then decode steps with one)
PROMPT, CHUNKS, OTHER = random_prompt(T, seed=3), [(0, 4), (4, 7)] + [(i, i + 1) for i in range(7, T)], \
    (random_prompt(4, seed=4), 0)
# one xdist worker runs the module (pyproject --dist loadgroup): the `mixed` runs are made once
pytestmark = pytest.mark.xdist_group("engine-triton")


@pytest.fixture(scope="module")
def models(tiny_ckpts):
    return (GptOssModel.from_checkpoint(tiny_ckpts["bf16"], backend="triton", device=DEVICE),
            GptOssModel.from_checkpoint(tiny_ckpts["bf16"], backend="torch", device="cpu"))


def run(model, prompt, chunks, slot=0, slots=1, other=None):
    """Feed `prompt` in (lo, hi) chunks into `slot`; `other` = (prompt2, slot2) joins the first chunk.
    Returns the logits on the model's device."""
    cache = model.new_cache(slots, len(prompt))
    out = []
    for n, (lo, hi) in enumerate(chunks):
        toks, pos, sl = list(prompt[lo:hi]), list(range(lo, hi)), [slot] * (hi - lo)
        if other is not None and n == 0:
            p2, s2 = other
            toks, pos, sl = list(p2) + toks, list(range(len(p2))) + pos, [s2] * len(p2) + sl
        ints = lambda v: torch.tensor(v, dtype=torch.int64, device=model.device)   # noqa: E731
        logits = model.forward(ints(toks), ints(pos), ints(sl), cache).logits
        out.append(logits[-(hi - lo):])
    return torch.cat(out)


def traced(model, ops=TRITON):
    """(logits, trace) of PROMPT fed in CHUNKS in slot 1 beside OTHER, under the ops table `ops`."""
    model.trace = OpTrace()
    model.use_ops(ops)
    try:
        return run(model, PROMPT, CHUNKS, slot=1, slots=2, other=OTHER), model.trace
    finally:
        model.trace = None
        model.use_ops(TRITON)


@pytest.fixture(scope="module")
def mixed(models):
    """The Triton forward's (logits, trace) of the mixed run: each test reads it."""
    return traced(models[0])


def test_triton_engine_is_deterministic_and_close_to_torch(models, mixed):
    mt, m0 = models
    full = run(mt, PROMPT, [(0, T)])
    assert full.device.type == DEVICE.type and torch.isfinite(full).all()
    assert full.equal(run(mt, PROMPT, [(0, T)]))                                           # D1
    assert full.equal(mixed[0])                      # D2 and D3: chunks, decode steps, a batchmate
    ref = run(m0, PROMPT, [(0, T)])                                                        # on the CPU
    torch.testing.assert_close(full.cpu(), ref, rtol=0, atol=1e-3)
    assert full.cpu().argmax(-1).equal(ref.argmax(-1))


# ------------------------------------------------------------------ the grouped experts keep the bits
def _per_chunk_partials(x, weight, bounds, prologue=None, x_per_k=1):
    """The Triton ops' chunk partials before linear_chunks_triton: one linear_triton per chunk on a
    fresh contiguous copy. -> [C, M, N] fp32."""
    parts = []
    for lo, hi in bounds:
        xc = x[:, x_per_k * lo:x_per_k * hi].clone(memory_format=torch.contiguous_format)
        if prologue is not None:
            xc = prologue(xc).contiguous()
        parts.append(linear_triton(xc, weight[:, lo:hi].clone(memory_format=torch.contiguous_format), None,
                                   out_dtype=torch.float32))
    return torch.stack(parts)


def _experts_per_expert(x, top_ids, held):
    """The Triton ops' experts before grouping on the device: for each expert its rows (found on the
    host), linear_triton for gate_up, then per K chunk the SwiGLU and down."""
    gate_up_w, gate_up_b, down_w, bounds = held.gate_up_w, held.gate_up_b, held.down_w, list(held.bounds)
    expert_lo, n_local, alpha, limit = held.lo, held.n, held.alpha, held.limit
    T, H = x.shape
    k = top_ids.shape[1]
    out = x.new_zeros((len(bounds), T * k, H), dtype=torch.float32)
    act = lambda g: clamped_swiglu_triton(g, alpha, limit)  # noqa: E731
    flat_ids = top_ids.reshape(-1)
    for e in range(n_local):
        rows = (flat_ids == e + expert_lo).nonzero()[:, 0]
        if rows.numel() == 0:
            continue
        xe = x.index_select(0, torch.div(rows, k, rounding_mode="floor"))
        h = linear_triton(xe, gate_up_w[e], gate_up_b[e])
        parts = _per_chunk_partials(h, down_w[e], bounds, prologue=act, x_per_k=2)
        out.index_copy_(1, rows, parts)
    return out


def test_grouped_experts_and_chunk_launches_keep_the_per_expert_bits(models, mixed):
    """The Triton forward (experts grouped on the device, every K chunk in one launch) gives the
    bits of the per-expert, per-chunk path it replaced: logits and every traced op, for the mixed
    run (prefill chunks with a second request, then decode steps). On a GPU this is the check of
    the compiled kernels."""
    new_logits, new_trace = mixed
    old_logits, old_trace = traced(models[0], replace(TRITON, experts=_experts_per_expert,
                                                      chunk_partials=_per_chunk_partials))
    assert new_logits.view(torch.int32).equal(old_logits.view(torch.int32))
    assert list(new_trace.ops) == list(old_trace.ops) and "L0.experts" in new_trace.ops
    for name, b in old_trace.ops.items():
        a = new_trace.ops[name]
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert a.contiguous().view(torch.uint8).equal(b.contiguous().view(torch.uint8)), name


def test_decode_step_reads_no_tensor_value_on_the_host(models, monkeypatch):
    """Graph-capturable on the Triton backend too: no .item(), .tolist(), bool(), int() or
    .nonzero() of a tensor inside a decode step (the experts are grouped on the device)."""
    mt, _ = models
    cache = mt.new_cache(4, 16)
    ints = lambda v: torch.tensor(v, dtype=torch.int64, device=mt.device)   # noqa: E731
    mt.forward(ints(random_prompt(6, seed=5)), ints(list(range(6))), ints([0] * 6), cache)
    mt.forward(ints([5, 7, 9]), ints([6, 0, 0]), ints([0, 1, 3]), cache)        # compile / warm up

    def forbidden(*args, **kwargs):
        raise AssertionError("host read of a tensor value inside forward")
    with monkeypatch.context() as m:
        for name in ("item", "tolist", "__bool__", "__int__", "__index__", "__float__", "nonzero"):
            m.setattr(torch.Tensor, name, forbidden)
        m.setattr(torch, "nonzero", forbidden)
        out = mt.forward(ints([5, 7, 0]), ints([6, 1, 1]), ints([0, 1, 3]), cache)
    assert out.logits.shape == (3, 512) and torch.isfinite(out.logits).all()
