"""Batch-invariant linear layer: y = x @ W^T + b (DESIGN §2 D2/D3, §8 unguarded tails).

    x [M, K]  (fp32 or bf16)      W [N, K] (same dtype)      b [N] or None      -> y [M, N]

Every output element y[m, n] is accumulated in fp32 over K in fixed BLOCK_K chunks, first to
last, with no split-K; the tile sizes are module constants (per platform, never derived from
M, N or K). So the bits of a row depend only on that row, W, b and K: not on M, on the row's
index inside its tile, or on N. Tails in M, N and K are masked loads with zero fill (a masked
lane contributes an exact +0), so N = 2880 / 2881 with BLOCK_N = 64 need no special case.

On the interpreter the tile product is an explicit broadcast multiply + tl.sum over BLOCK_K
(tl.dot is a numpy matmul there and is not row invariant; see kernels/_common.py). On a GPU
it is tl.dot with input_precision="ieee".

The torch reference is F.linear in fp32 (the value reference; it is not batch invariant on
the CPU — engine.linear's torch backend is the invariant torch path).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels import check_backend
from kernels._common import INTERPRET, USE_DOT, check_float

# Fixed tiles: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages). Never chosen from shapes.
TILES = (16, 128, 128, 4, 1) if INTERPRET else (64, 64, 64, 4, 3)


@triton.jit
def _linear_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K,
                   HAS_BIAS: tl.constexpr, USE_DOT: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # program (pid_n, pid_m) computes y[rm, rn]: a [BLOCK_M, BLOCK_N] tile; x, W, y row-major.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)      # [BM]
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)      # [BN]
    m_ok = rm < M
    n_ok = rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):                                     # one fixed order
        rk = k0 + tl.arange(0, BLOCK_K)                                 # [BK]
        k_ok = rk < K
        a = tl.load(x_ptr + rm[:, None] * K + rk[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)      # [BM, BK]
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :],
                    mask=n_ok[:, None] & k_ok[None, :], other=0.0)      # [BN, BK]
        if USE_DOT:
            acc = tl.dot(a, tl.trans(w), acc, input_precision="ieee")   # [BM, BN]
        else:
            prod = a.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]   # [BM, BN, BK]
            acc += tl.sum(prod, axis=2)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """-> y [M, N] in out_dtype (default x's): the fp32 accumulator rounded once."""
    x, weight, bias = _check(x, weight, bias)
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty((M, N), dtype=out_dtype or x.dtype, device=x.device)
    if M == 0 or N == 0:
        return y
    if K == 0:
        return y.copy_(bias.expand(M, N) if bias is not None else torch.zeros_like(y))
    bm, bn, bk, warps, stages = TILES
    grid = (triton.cdiv(N, bn), triton.cdiv(M, bm))
    _linear_kernel[grid](x, weight, bias if bias is not None else x, y, M, N, K,
                         HAS_BIAS=bias is not None, USE_DOT=USE_DOT,
                         BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages)
    return y


def linear_torch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    x, weight, bias = _check(x, weight, bias)
    b = bias.to(torch.float32) if bias is not None else None
    return F.linear(x.to(torch.float32), weight.to(torch.float32), b).to(x.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           backend: str = "torch") -> torch.Tensor:
    """x [M, K], weight [N, K], bias [N] or None -> [M, N] in x's dtype (fp32 accumulation)."""
    if check_backend(backend) == "triton":
        return linear_triton(x, weight, bias)
    return linear_torch(x, weight, bias)


def _check(x, weight, bias):
    check_float("x", x, 2)
    check_float("weight", weight, 2)
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit [M, K] x [N, K]")
    if weight.dtype != x.dtype or weight.device != x.device:
        raise ValueError(f"linear: weight ({weight.dtype}, {weight.device}) must match x ({x.dtype}, {x.device})")
    if bias is not None:
        if bias.shape != (weight.shape[0],) or bias.device != x.device:
            raise ValueError(f"linear: bias must be [{weight.shape[0]}] on {x.device}, got {tuple(bias.shape)}")
        bias = bias.contiguous()
    return x.contiguous(), weight.contiguous(), bias
