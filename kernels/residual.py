"""The ends of the two sublayers, fused: fixed-tree sums of K-chunk partials into the residual.

    o_proj:  x_out[t] = act(x[t] + (tree(parts[:, t]) + bias))                              (1)
    MoE:     y[t, s]  = tree(parts[:, t * k + s]) + down_b[ids[t, s]]
             x_out[t] = act(x[t] + ((w[t, 0] * y[t, 0] + w[t, 1] * y[t, 1]) + ...))          (2)

    parts [8, R, H] fp32 (the 8 fixed K chunks of DESIGN §2), x [T, H] (the residual stream,
    fp32 or bf16), bias [H] / down_b [E, H] fp32, w [T, k] fp32 routing weights, ids [T, k]
    -> x_out [T, H] in x's dtype: the fp32 sum rounded once (act = the policy's dtype)

tree(p) = ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)), engine.linear.tree_sum's order,
and the k slots are added first to last. These are exactly the operations engine/model.py does
with separate torch calls (each its own rounding: the kernels are compiled with
enable_fp_fusion=False, so no multiply-add is fused), so the fused and unfused paths give the
same bits (tests/kernels/test_residual.py) and the model can take either (it takes the
unfused one while a trace records the intermediate ops). Elementwise per (t, h): nothing
depends on the batch. One launch instead of about a dozen tiny ones per sublayer: on a GPU
a decode step is a few thousand such launches, so their count sets its time.
"""

from __future__ import annotations

import torch
from lockstep.kernels import _common  # noqa: F401  (first: it sets TRITON_INTERPRET before triton is imported)
import triton
import triton.language as tl

from lockstep.kernels.portable_tl import cast_rne

BLOCK_H = 1024


@triton.jit
def _tree8(p_ptr, R, H, r, h, ok):
    """((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)) of partials p_ptr[c, r, h]."""
    stride = R * H
    base = p_ptr + r * H + h
    p0 = tl.load(base, mask=ok, other=0.0)
    p1 = tl.load(base + stride, mask=ok, other=0.0)
    p2 = tl.load(base + 2 * stride, mask=ok, other=0.0)
    p3 = tl.load(base + 3 * stride, mask=ok, other=0.0)
    p4 = tl.load(base + 4 * stride, mask=ok, other=0.0)
    p5 = tl.load(base + 5 * stride, mask=ok, other=0.0)
    p6 = tl.load(base + 6 * stride, mask=ok, other=0.0)
    p7 = tl.load(base + 7 * stride, mask=ok, other=0.0)
    return ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7))


# T (the rows) is not specialized, here and in _moe_residual_kernel: it only indexes (the partials'
# stride); each element's additions are the same whatever it is. H (the model's) is.
@triton.jit(do_not_specialize=["T"])
def _row_parallel_residual_kernel(x_ptr, p_ptr, b_ptr, out_ptr, T, H, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = h < H
    y = _tree8(p_ptr, T, H, t, h, ok) + tl.load(b_ptr + h, mask=ok, other=0.0)
    x = tl.load(x_ptr + t * H + h, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * H + h, cast_rne(x + y, out_ptr.dtype.element_ty), mask=ok)


@triton.jit(do_not_specialize=["T"])
def _moe_residual_kernel(x_ptr, p_ptr, db_ptr, w_ptr, id_ptr, out_ptr, T, H,
                         K_TOP: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = h < H
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(K_TOP):                                  # slot order
        e = tl.load(id_ptr + t * K_TOP + s)
        y = _tree8(p_ptr, T * K_TOP, H, t * K_TOP + s, h, ok) + tl.load(db_ptr + e * H + h, mask=ok, other=0.0)
        weighted = tl.load(w_ptr + t * K_TOP + s) * y
        if s == 0:
            total = weighted
        else:
            total = total + weighted
    x = tl.load(x_ptr + t * H + h, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * H + h, cast_rne(x + total, out_ptr.dtype.element_ty), mask=ok)


def row_parallel_residual_triton(x: torch.Tensor, parts: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """(1): x [T, H], parts [8, T, H] fp32, bias [H] fp32 -> [T, H] in x's dtype."""
    T, H = _check(x, parts, T_rows=x.shape[0])
    if bias.shape != (H,) or bias.dtype != torch.float32:
        raise ValueError(f"row_parallel_residual: bias must be fp32 [{H}], got {bias.dtype} {tuple(bias.shape)}")
    out = torch.empty_like(x)
    if T:
        _row_parallel_residual_kernel[(T, triton.cdiv(H, BLOCK_H))](
            x.contiguous(), parts.contiguous(), bias.contiguous(), out, T, H, BLOCK=BLOCK_H,
            num_warps=4, enable_fp_fusion=False)
    return out


def moe_residual_triton(x: torch.Tensor, parts: torch.Tensor, down_b: torch.Tensor, routing: torch.Tensor,
                        ids: torch.Tensor) -> torch.Tensor:
    """(2): x [T, H], parts [8, T * k, H] fp32, down_b [E, H] fp32, routing [T, k] fp32, ids [T, k]
    int64 -> [T, H] in x's dtype."""
    T, k = ids.shape
    _, H = _check(x, parts, T_rows=T * k)
    if routing.shape != (T, k) or routing.dtype != torch.float32 or ids.dtype != torch.int64:
        raise ValueError(f"moe_residual: routing must be fp32 [{T}, {k}] and ids int64 of that shape, got "
                         f"{routing.dtype} {tuple(routing.shape)} and {ids.dtype} {tuple(ids.shape)}")
    if down_b.dim() != 2 or down_b.shape[1] != H or down_b.dtype != torch.float32:
        raise ValueError(f"moe_residual: down_b must be fp32 [E, {H}], got {down_b.dtype} {tuple(down_b.shape)}")
    out = torch.empty_like(x)
    if T:
        _moe_residual_kernel[(T, triton.cdiv(H, BLOCK_H))](
            x.contiguous(), parts.contiguous(), down_b.contiguous(), routing.contiguous(), ids.contiguous(), out,
            T, H, K_TOP=k, BLOCK=BLOCK_H, num_warps=4, enable_fp_fusion=False)
    return out


# --------------------------------------------------------------------------- torch references
# Bit-exact: (1) and (2) as separate torch operations, each one rounding. The torch ops table has no
# fused ends (engine/model.py runs these operations itself, between the points a trace records);
# the kernel tests compare against these restatements bitwise, and tests/engine/test_dtype_policy.py
# holds the model's fused and unfused paths to the same bits.
def _tree8_torch(parts: torch.Tensor) -> torch.Tensor:
    p = list(parts.unbind(0))
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]))


def row_parallel_residual_portable(x, parts, bias):
    _check(x, parts, T_rows=x.shape[0])
    return torch.add(x.to(torch.float32), _tree8_torch(parts) + bias).to(x.dtype)


def moe_residual_portable(x, parts, down_b, routing, ids):
    T, k = ids.shape
    _check(x, parts, T_rows=T * k)
    y = (_tree8_torch(parts) + down_b.index_select(0, ids.reshape(-1))).view(T, k, -1)
    weighted = torch.mul(y, routing[..., None])
    total = weighted[:, 0]
    for s in range(1, k):
        total = torch.add(total, weighted[:, s])
    return torch.add(x.to(torch.float32), total).to(x.dtype)


def _check(x, parts, T_rows):
    if x.dim() != 2 or parts.dim() != 3 or parts.shape[0] != 8 or parts.shape[1:] != (T_rows, x.shape[1]):
        raise ValueError(f"residual: parts must be [8, {T_rows}, {x.shape[1] if x.dim() == 2 else 'H'}] for x "
                         f"{tuple(x.shape)}, got {tuple(parts.shape)}")
    if parts.dtype != torch.float32 or parts.device != x.device:
        raise ValueError(f"residual: parts must be fp32 on {x.device}, got {parts.dtype} on {parts.device}")
    return x.shape
