"""The Triton primitives the kernels are built from, one elementwise launch each, so their bits
can be pinned on dense grids (harness/kinds/primitive.py) next to kernels.portable's.

    apply(name, x) -> y        x [n] -> y [n] (sincos64: (sin, cos)); names in FUNCTIONS

Each function is exactly what a kernel computes: `exp_f32`, `sigmoid_f32`, `log_f64`, `exp64` and
`cast_rne` of kernels/portable_tl.py (with PORTABLE_MATH: portable polynomials in the interpreter,
the GPU's functions when compiled), `tl.sqrt` (rmsnorm), the bf16 -> fp32 load-and-widen and the
float64 -> fp32 narrowing every kernel does, and `tl.sum` / `tl.cumsum` over a block (the reductions
the kernels end their tiles with).
"""

from __future__ import annotations

import torch
from lockstep.kernels import _common  # noqa: F401  (first: it sets TRITON_INTERPRET before triton is imported)
import triton
import triton.language as tl

from lockstep.kernels._common import PORTABLE_MATH, next_pow2
from lockstep.kernels.portable_tl import cast_rne, exp64, exp_f32, log_f64, sigmoid_f32

# name -> (code, input dtype, output dtype)
FUNCTIONS = {
    "exp": (0, torch.float32, torch.float32),
    "log": (1, torch.float32, torch.float32),
    "sigmoid": (2, torch.float32, torch.float32),
    "sqrt": (3, torch.float32, torch.float32),
    "to_bf16": (4, torch.float32, torch.bfloat16),
    "to_fp32": (5, torch.bfloat16, torch.float32),
    "f64_to_f32": (6, torch.float64, torch.float32),
    "exp64": (7, torch.float64, torch.float64),
    "log64": (8, torch.float64, torch.float64),
}
REDUCTIONS = ("block_sum", "block_cumsum")   # x [R, n] -> tl.sum / tl.cumsum of each row, in fp32
BLOCK = 1024


@triton.jit
def _unary_kernel(x_ptr, y_ptr, n, FN: tl.constexpr, PORTABLE: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < n
    x = tl.load(x_ptr + i, mask=ok, other=1.0)
    if FN == 0:
        y = exp_f32(x, PORTABLE)
    elif FN == 1:
        y = log_f64(x.to(tl.float64), PORTABLE).to(tl.float32)
    elif FN == 2:
        y = sigmoid_f32(x, PORTABLE)
    elif FN == 3:
        y = tl.sqrt(x)
    elif FN == 4:
        y = cast_rne(x, tl.bfloat16)
    elif FN == 5:
        y = x.to(tl.float32)
    elif FN == 6:
        y = x.to(tl.float32)
    elif FN == 7:
        y = exp64(x)
    else:
        y = log_f64(x, PORTABLE)
    tl.store(y_ptr + i, y, mask=ok)


# n stays specialized: whether rows start 16-byte aligned picks the loads' vector width, which can
# pick the layout tl.sum / tl.cumsum add in (the order of the float additions).
@triton.jit
def _row_kernel(x_ptr, y_ptr, n, CUMSUM: tl.constexpr, BLOCK: tl.constexpr):
    """One row per program, the whole row in one block (zero-padded): tl.sum or tl.cumsum."""
    r = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK)
    ok = j < n
    x = tl.load(x_ptr + r * n + j, mask=ok, other=0.0).to(tl.float32)
    if CUMSUM:
        tl.store(y_ptr + r * n + j, tl.cumsum(x, axis=0), mask=ok)
    else:
        tl.store(y_ptr + r, tl.sum(x, axis=0))


def apply(name: str, x: torch.Tensor) -> torch.Tensor:
    """The Triton primitive `name` of x (1-D, the function's input dtype; rows [R, n] for REDUCTIONS)."""
    if name in REDUCTIONS:
        R, n = x.shape
        cumsum = name == "block_cumsum"
        y = torch.empty((R, n) if cumsum else (R,), dtype=torch.float32, device=x.device)
        if R and n:
            # num_warps as Triton's default, written out: the warps set the layout the row adds in
            _row_kernel[(R,)](x.contiguous(), y, n, CUMSUM=cumsum, BLOCK=next_pow2(n), num_warps=4,
                              enable_fp_fusion=True)
        return y
    code, dt_in, dt_out = FUNCTIONS[name]
    if x.dim() != 1 or x.dtype != dt_in:
        raise ValueError(f"{name} takes a 1-D {dt_in} tensor, got {x.dtype} of shape {list(x.shape)}")
    y = torch.empty(x.shape, dtype=dt_out, device=x.device)
    if x.numel():
        _unary_kernel[(triton.cdiv(x.numel(), BLOCK),)](x.contiguous(), y, x.numel(), FN=code,
                                                         PORTABLE=PORTABLE_MATH, BLOCK=BLOCK, enable_fp_fusion=True)
    return y
