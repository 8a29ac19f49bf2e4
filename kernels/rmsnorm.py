"""RMSNorm (DESIGN §7): y = x / sqrt(mean(x^2) + eps) * weight, in fp32, cast back to x's dtype.

    x [M, N] (fp32 / bf16)     weight [N]     -> y [M, N]

One program per row. The sum of squares is accumulated elementwise in fixed BLOCK_N chunks
(first to last) and reduced once at the end, so a row's bits depend only on the row, the
weight and N (never on M or the row index). Tails are masked loads with zero fill, so
N in {1, 127, 129, 2880, 2881} need no special case.
"""

from __future__ import annotations

import torch
from lockstep.kernels import _common  # noqa: F401  (first: it sets TRITON_INTERPRET before triton is imported)
import triton
import triton.language as tl

from lockstep.kernels._common import check_float
from lockstep.kernels.case import KernelCase
from lockstep.kernels.portable import sqrt, tree_sum
from lockstep.kernels.portable_tl import cast_rne

BLOCK_N = 1024


@triton.jit
def _rmsnorm_kernel(x_ptr, w_ptr, y_ptr, N, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = row * N
    sq = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        x = tl.load(x_ptr + base + cols, mask=cols < N, other=0.0).to(tl.float32)
        sq += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / N + eps)
    for n0 in range(0, N, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        ok = cols < N
        x = tl.load(x_ptr + base + cols, mask=ok, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + base + cols, cast_rne(x * rstd * w, y_ptr.dtype.element_ty), mask=ok)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float,
                    out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """-> [M, N] in out_dtype (default x's): fp32 math, rounded once at the store."""
    x, weight = _check(x, weight)
    y = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    if x.numel():
        _rmsnorm_kernel[(x.shape[0],)](x, weight, y, x.shape[1], float(eps), BLOCK_N=BLOCK_N, num_warps=4,
                                         enable_fp_fusion=True)
    return y


# --------------------------------------------------------------------------- torch references
def rms_norm_portable(x: torch.Tensor, weight: torch.Tensor, eps: float,
                      out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The bit-exact reference: the same bits on every machine (kernels/portable.py's single IEEE
    operations). x [..., H] -> (x * (1 / sqrt(tree_sum(x * x) / H + eps))) * weight in fp32, the
    mean a fixed tree over H, the square root portable.sqrt, rounded once to out_dtype. The torch
    ops table runs it (the goldens' reference) and the rmsnorm kernel specs compare against it."""
    x = x.to(torch.float32)
    mean_sq = torch.div(tree_sum(torch.mul(x, x), -1, keepdim=True), x.shape[-1])
    inv = torch.div(1.0, sqrt(torch.add(mean_sq, eps)))
    return torch.mul(torch.mul(x, inv), weight.to(torch.float32)).to(out_dtype)


def rms_norm_fast(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype) -> torch.Tensor:
    """Values only: torch's own mean and rsqrt, whose bits follow the CPU and the batch. The fast
    ops table's RMSNorm on the CPU (bench/e2e.py measures what determinism costs); no spec uses it."""
    x = x.to(torch.float32)
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight).to(out_dtype)


def _check(x, weight):
    check_float("x", x, 2)
    check_float("weight", weight, 1)
    if weight.shape[0] != x.shape[1] or weight.device != x.device:
        raise ValueError(f"rms_norm: weight {tuple(weight.shape)} does not fit x {tuple(x.shape)}")
    return x.contiguous(), weight.contiguous()


# --------------------------------------------------------------------------- the kernel spec's case
def _rmsnorm_op(x, w, eps):
    return rms_norm_triton(x, w, eps)


CASES = (KernelCase(
    name="rmsnorm", dims=("M", "N"), op=_rmsnorm_op, interface=True,
    inputs=lambda inp, s, d: {"x": d.normal(s["M"], s["N"], scale=inp["scale"]), "weight": d.normal(s["N"])},
    call=lambda op, x, r, offered: op(x["x"][r], x["weight"], 1e-5),
    reference=lambda x: rms_norm_portable(x["x"], x["weight"], 1e-5, out_dtype=x["x"].dtype),
    elements=lambda s: 3 * s["M"] * s["N"] + s["N"], note="lockstep.kernels.rmsnorm.rms_norm_triton"),)
