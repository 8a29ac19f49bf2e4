"""lockstep.kernels.rmsnorm, kernels.rope, kernels.moe, kernels.sampling: each `_triton` kernel against its torch reference."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from lockstep.engine.sampling import SamplingParams, keep_mask, sample
from lockstep.engine.linear import k_chunk_bounds
from lockstep.kernels.moe import (EXPERT_BLOCK_M, clamped_swiglu_portable, clamped_swiglu_triton, expert_down_partials_triton,
                         expert_gate_up_triton, group_by_expert, router_top_k_portable, router_top_k_triton)
from lockstep.kernels.rmsnorm import rms_norm_portable, rms_norm_triton
from lockstep.kernels.rope import apply_rope_portable, apply_rope_triton
from lockstep.kernels.sampling import gumbel_argmax_torch, gumbel_argmax_triton
from tests.kernels.conftest import DEVICE

# Inputs are made on the CPU from seeded generators (the same values everywhere) and moved to
# DEVICE; the Triton kernel and its torch reference then run on the same DEVICE tensors.
G = lambda s: torch.Generator().manual_seed(s)   # noqa: E731


def dev(values, dtype=None):
    """A tensor from a Python literal, on DEVICE."""
    return torch.tensor(values, dtype=dtype, device=DEVICE)


# ------------------------------------------------------------------ rmsnorm (fp32 math)
@pytest.mark.parametrize("N", [1, 127, 129, 2880, 2881])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_tails_and_rows(N, dtype):
    x = (torch.randn(6, N, generator=G(N)) * 3).to(dtype).to(DEVICE)
    w = torch.randn(N, generator=G(N + 1)).to(dtype).to(DEVICE)
    y = rms_norm_triton(x, w, 1e-5)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(y.float(), rms_norm_portable(x, w, 1e-5).float(), **tol)
    for r in (0, 5):
        assert rms_norm_triton(x[r:r + 1], w, 1e-5).equal(y[r:r + 1])


def test_rmsnorm_zero_row_and_huge_values():
    x = dev([[0.0] * 5, [3e18, -3e18, 1.0, 0.0, 2.0]])
    w = torch.ones(5, device=DEVICE)
    y = rms_norm_triton(x, w, 1e-5)
    assert y[0].eq(0).all() and torch.isfinite(y).all()
    torch.testing.assert_close(y, rms_norm_portable(x, w, 1e-5), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ rope (elementwise)
@pytest.mark.parametrize("H, D", [(1, 2), (3, 32), (8, 64), (5, 128)])
def test_rope_matches_reference(H, D):
    x = torch.randn(7, H, D, generator=G(D)).to(DEVICE)
    ang = torch.randn(7, D // 2, generator=G(H)) * 100
    cos, sin = (ang.cos() * 1.35).to(DEVICE), (ang.sin() * 1.35).to(DEVICE)
    torch.testing.assert_close(apply_rope_triton(x, cos, sin), apply_rope_portable(x, cos, sin), rtol=1e-6, atol=1e-6)
    xb = x.to(torch.bfloat16)
    torch.testing.assert_close(apply_rope_triton(xb, cos, sin).float(), apply_rope_portable(xb, cos, sin).float(),
                               rtol=1.6e-2, atol=1e-2)


def test_rope_agrees_with_engine():
    from lockstep.engine.config import preset
    from lockstep.engine.rope import rope_cos_sin, rope_frequencies
    inv, ms = rope_frequencies(64, preset("gpt-oss-20b").rope)
    cos, sin = rope_cos_sin(torch.tensor([0, 1, 4095, 131071]), inv, ms)      # on the CPU
    cos, sin = cos.to(DEVICE), sin.to(DEVICE)
    x = torch.randn(4, 8, 64, generator=G(3)).to(DEVICE)
    torch.testing.assert_close(apply_rope_triton(x, cos, sin), apply_rope_portable(x, cos, sin), rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ router top-k
def test_top_k_ties_go_to_the_lowest_index():
    logits = dev([[1.0] * 8,
                  [0.0, 5.0, 5.0, 1.0, 5.0, 0.0, 0.0, 5.0],
                  [float("-inf")] * 6 + [2.0, 2.0],
                  [3.0, -1.0, 3.0, 3.0, -1.0, 7.0, -1.0, -1.0]])
    for backend, router_top_k in (("torch", router_top_k_portable), ("triton", router_top_k_triton)):
        w, ids = router_top_k(logits, 4)
        assert ids.tolist() == [[0, 1, 2, 3], [1, 2, 4, 7], [6, 7, 0, 1], [5, 0, 2, 3]], backend
        assert torch.isfinite(w).all()
    wt, _ = router_top_k_triton(logits, 4)
    torch.testing.assert_close(wt, router_top_k_portable(logits, 4)[0], rtol=1e-6, atol=1e-7)


@settings(max_examples=15, deadline=None)
@given(T=st.integers(1, 9), E=st.sampled_from([4, 5, 32, 128]), k=st.integers(1, 4), seed=st.integers(0, 10**6),
       levels=st.sampled_from([0, 3]))
def test_property_top_k(T, E, k, seed, levels):
    logits = torch.randn(T, E, generator=G(seed)) * 4
    if levels:                                     # few distinct values: many ties
        logits = logits.round().clamp(-levels, levels)
    logits = logits.to(DEVICE)
    w, ids = router_top_k_triton(logits, k)
    w0, ids0 = router_top_k_portable(logits, k)
    assert ids.equal(ids0)
    torch.testing.assert_close(w, w0, rtol=1e-6, atol=1e-7)


def test_top_k_large_and_small_logits():
    logits = dev([[1e30, -1e30, 1e-30, 0.0, 88.0, -88.0]])
    w, ids = router_top_k_triton(logits, 3)
    assert ids.tolist() == [[0, 4, 2]] and torch.isfinite(w).all()
    torch.testing.assert_close(w, router_top_k_portable(logits, 3)[0])


# ------------------------------------------------------------------ clamped SwiGLU
@pytest.mark.filterwarnings("ignore:overflow encountered")
def test_swiglu_clamps_and_interleaving():
    gu = dev([[8.0, 9.0, -100.0, -9.0, 7.0, 7.0, 0.5, -0.5]])
    y = clamped_swiglu_triton(gu)
    # gate 8 -> 7, up 9 -> 7; gate -100 stays, up -9 -> -7; gate 7, up 7; gate .5, up -.5
    s = torch.sigmoid
    want = dev([[7 * s(torch.tensor(1.702 * 7)) * 8, -100 * s(torch.tensor(-170.2)) * -6,
                 7 * s(torch.tensor(1.702 * 7)) * 8, 0.5 * s(torch.tensor(0.851)) * 0.5]])   # CPU math
    torch.testing.assert_close(y, want, rtol=1e-6, atol=1e-6)
    x = (torch.randn(5, 2 * 129, generator=G(1)) * 20).to(DEVICE)
    torch.testing.assert_close(clamped_swiglu_triton(x), clamped_swiglu_portable(x), rtol=1e-6, atol=1e-5)


# ------------------------------------------------------------------ experts
def experts(E, H, I, seed=0, dtype=torch.float32):
    """gate_up_w, gate_up_b, down_w, down_b on DEVICE."""
    g = G(seed)
    W = ((torch.randn(E, 2 * I, H, generator=g) / H ** 0.5).to(dtype), torch.randn(E, 2 * I, generator=g).to(dtype),
         (torch.randn(E, H, I, generator=g) / I ** 0.5).to(dtype), torch.randn(E, H, generator=g).to(dtype))
    return tuple(w.to(DEVICE) for w in W)


def test_expert_parallel_skips_non_local_experts():
    """Experts split over 2 ranks, the grouped kernels the engine runs: each rank holds only its
    shard; a (token, slot) row of a non-local expert is skipped (exactly 0 in every partial), never
    multiplied by zero, so a NaN-producing expert elsewhere never leaks in. The halves add up to
    the whole, bit for bit."""
    E, H, I, k = 8, 33, 16, 2
    gw, gb, dw, _ = experts(E, H, I, seed=9)
    x = torch.randn(6, H, generator=G(10)).to(DEVICE)
    ids = dev([[0, 1], [2, 3], [4, 5], [6, 7], [1, 6], [7, 0]])
    flat, bounds = ids.reshape(-1), k_chunk_bounds(I)

    def parts(lo, n, gw, gb, dw):
        groups = group_by_expert(flat, lo, n, EXPERT_BLOCK_M)
        h = expert_gate_up_triton(x, k, groups, gw, gb)
        return expert_down_partials_triton(clamped_swiglu_triton(h), groups, dw, bounds)    # [8, T * k, H]

    full = parts(0, E, gw, gb, dw)
    lo, hi = parts(0, 4, gw[:4], gb[:4], dw[:4]), parts(4, 4, gw[4:], gb[4:], dw[4:])
    local = flat < 4
    assert lo[:, ~local].eq(0).all() and hi[:, local].eq(0).all()
    assert (lo + hi).equal(full)
    bad_dw = torch.full_like(dw[4:], float("inf"))   # rank 1's experts blow up; rank 0's rows must not see it
    bad = parts(4, 4, gw[4:], gb[4:], bad_dw)
    assert bad[:, local].eq(0).all() and not torch.isfinite(bad[:, ~local]).all()


# ------------------------------------------------------------------ seeded Gumbel-max
@pytest.mark.parametrize("V", [1, 127, 1025, 201088])
def test_gumbel_argmax_matches_reference(V):
    R = 3 if V > 2000 else 6
    logp = torch.log_softmax(torch.randn(R, V, generator=G(V), dtype=torch.float64) * 2, -1).to(DEVICE)
    seeds = dev([0, 42, -1, 7, 1 << 40, 3])[:R]
    pos = dev([0, 7, 123, 5, 99, 100000])[:R]
    assert gumbel_argmax_triton(logp, seeds, pos).equal(gumbel_argmax_torch(logp, seeds, pos))


def test_gumbel_argmax_is_engine_sample():
    V = 3000
    logits = torch.randn(V, generator=G(11)) * 3
    for params, seed, pos in ((SamplingParams(temperature=0.7), 5, 17), (SamplingParams(top_k=20), 1 << 63, 0),
                              (SamplingParams(top_p=0.5, min_p=0.01), 123, 4096)):
        z = logits.to(torch.float64) / params.temperature
        keep = keep_mask(z, params.top_k, params.top_p, params.min_p)
        logp = torch.log_softmax(torch.where(keep, z, float("-inf")), dim=-1)[None].to(DEVICE)
        s = dev([seed - (1 << 64) if seed >= 1 << 63 else seed])
        got = gumbel_argmax_triton(logp, s, dev([pos]))
        assert int(got) == sample(logits, params, seed, pos)


def test_gumbel_argmax_ties_and_all_masked():
    # every id masked: the first index (as torch.argmax); identical rows: identical ids
    logp = torch.full((2, 2100), float("-inf"), dtype=torch.float64, device=DEVICE)
    assert gumbel_argmax_triton(logp, dev([1, 2]), dev([0, 0])).tolist() == [0, 0]
    logp = torch.zeros(3, 2100, dtype=torch.float64, device=DEVICE)
    out = gumbel_argmax_triton(logp, dev([9, 9, 10]), dev([4, 4, 4]))
    assert out[0] == out[1] and out.equal(gumbel_argmax_torch(logp, dev([9, 9, 10]), dev([4, 4, 4])))
