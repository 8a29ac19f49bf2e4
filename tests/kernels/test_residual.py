"""The fused sublayer ends (kernels/residual.py), RoPE + cache write (kernels/rope.py) and the
bf16 store rounding (kernels/portable_tl.cast_rne): bitwise equal to the unfused torch ops the
engine would otherwise run, and a row alone equal to the row inside any batch."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from lockstep.kernels.portable_tl import cast_rne
from lockstep.kernels.residual import (moe_residual_portable, moe_residual_triton, row_parallel_residual_portable,
                              row_parallel_residual_triton)
from lockstep.kernels.rope import apply_rope_portable as apply_rope, rope_qkv_cache_triton
from tests.kernels.conftest import DEVICE

DTYPES = [torch.float32, torch.bfloat16]


def _randn(*shape, seed, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_parallel_residual_equals_the_unfused_ops(dtype):
    T, H = 9, 200
    x, parts, bias = _randn(T, H, seed=1, dtype=dtype), _randn(8, T, H, seed=2) * 30, _randn(H, seed=3)
    fused = row_parallel_residual_triton(x, parts, bias)
    assert fused.dtype == dtype and torch.equal(fused, row_parallel_residual_portable(x, parts, bias))
    for t in (0, 4, T - 1):                                   # a row alone = the row in the batch
        assert torch.equal(row_parallel_residual_triton(x[t:t + 1], parts[:, t:t + 1], bias), fused[t:t + 1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_residual_equals_the_unfused_ops(dtype):
    T, k, H, E = 7, 4, 130, 6
    x = _randn(T, H, seed=4, dtype=dtype)
    parts, down_b = _randn(8, T * k, H, seed=5) * 10, _randn(E, H, seed=6)
    routing = torch.softmax(_randn(T, k, seed=7), -1)
    ids = torch.randint(0, E, (T, k), generator=torch.Generator().manual_seed(8)).to(DEVICE)
    fused = moe_residual_triton(x, parts, down_b, routing, ids)
    assert torch.equal(fused, moe_residual_portable(x, parts, down_b, routing, ids))
    t = 3
    alone = moe_residual_triton(x[t:t + 1], parts[:, t * k:(t + 1) * k], down_b, routing[t:t + 1], ids[t:t + 1])
    assert torch.equal(alone, fused[t:t + 1])


def test_residual_checks_its_inputs():
    x = _randn(2, 8, seed=1)
    with pytest.raises(ValueError, match=r"parts must be \[8, 2, 8\]"):
        row_parallel_residual_triton(x, _randn(4, 2, 8, seed=2), _randn(8, seed=3))
    with pytest.raises(ValueError, match="bias must be fp32"):
        row_parallel_residual_triton(x, _randn(8, 2, 8, seed=2), _randn(8, seed=3, dtype=torch.bfloat16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_qkv_cache_equals_rope_then_cache_write(dtype):
    T, Hq, Hkv, D, S = 5, 8, 2, 16, 32
    qkv = _randn(T, (Hq + 2 * Hkv) * D, seed=9, dtype=dtype)
    angles = _randn(T, D // 2, seed=10) * 3
    cos, sin = torch.cos(angles), torch.sin(angles)
    slots, positions = torch.tensor([1, 0, 1, 2, 0], device=DEVICE), torch.tensor([0, 3, 1, 7, 31], device=DEVICE)
    kc, vc = torch.zeros(3, Hkv, S, D, dtype=dtype, device=DEVICE), torch.zeros(3, Hkv, S, D, dtype=dtype, device=DEVICE)
    q = rope_qkv_cache_triton(qkv, cos, sin, kc, vc, slots, positions, Hq)
    qr, kr, vr = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=1)
    rot = lambda t, h: apply_rope(t.reshape(T, h, D).float(), cos, sin).to(dtype)   # noqa: E731 (engine's)
    assert torch.equal(q, rot(qr, Hq))
    kw, vw = torch.zeros_like(kc), torch.zeros_like(vc)
    kw[slots, :, positions] = rot(kr, Hkv)
    vw[slots, :, positions] = vr.reshape(T, Hkv, D)
    assert torch.equal(kc, kw) and torch.equal(vc, vw)


@triton.jit
def _cast_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, cast_rne(tl.load(x_ptr + i, mask=i < N), y_ptr.dtype.element_ty), mask=i < N)


def test_bf16_stores_round_to_nearest_even_like_torch():
    x = torch.cat([_randn(4000, seed=11), torch.tensor([float("inf"), -float("inf"), 3.4e38, -3.39e38, 1e-40,
                                                        -1e-39, 0.0, -0.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8],
                                                       device=DEVICE)])
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=DEVICE)
    _cast_kernel[(1,)](x, y, x.numel(), BLOCK=4096)
    assert torch.equal(y.view(torch.int16), x.to(torch.bfloat16).view(torch.int16))
    nan = torch.full((4,), float("nan"), device=DEVICE)
    _cast_kernel[(1,)](nan, y, 4, BLOCK=4)
    assert y[:4].isnan().all()


@pytest.mark.parametrize("k", [1, 3, 4, 8])
def test_router_kernel_portable_softmax_equals_kernels_portable(k):
    """The engine's Triton routing (engine.model._route): one kernel, kernels.portable.softmax's bits."""
    from lockstep.kernels import portable
    from lockstep.kernels.moe import router_top_k_triton
    logits = _randn(33, 32, seed=12) * 4
    w, ids = router_top_k_triton(logits, k, portable_softmax=True)
    values, ref_ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    assert torch.equal(ids, ref_ids[:, :k])
    assert torch.equal(w, portable.softmax(values[:, :k], dim=-1))


def test_group_by_expert_kernel_equals_the_torch_ops(monkeypatch):
    """Small routings are grouped by one kernel, large ones by torch ops: the same integers."""
    import lockstep.kernels.moe as moe
    ids = torch.randint(-2, 10, (4 * 9,), generator=torch.Generator().manual_seed(13)).to(DEVICE)
    ids = ids.clamp(min=0)
    for lo, n_local in ((0, 10), (3, 4)):
        small = moe.group_by_expert(ids, lo, n_local, 16)
        monkeypatch.setattr(moe, "GROUP_KERNEL_MAX", 0)
        large = moe.group_by_expert(ids, lo, n_local, 16)
        monkeypatch.undo()
        assert torch.equal(small[0], large[0]) and torch.equal(small[1], large[1])
