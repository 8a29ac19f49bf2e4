"""Rotary embedding, half-split (NeoX) rotation with given cos/sin (DESIGN §7, YaRN).

    x [T, H, D] (fp32 / bf16)    cos, sin [T, D/2] fp32 (YaRN mscale already applied)
    -> [T, H, D] in x's dtype:   x1, x2 = x[..., :D/2], x[..., D/2:]
                                 out = [x1 cos - x2 sin, x2 cos + x1 sin]   (fp32 math)

Purely elementwise: one program per token, all heads in one [H_PAD, D/2_PAD] tile, so there
is no reduction and nothing can depend on the batch. engine.rope computes cos/sin.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import check_backend
from kernels._common import check_float, next_pow2


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, H, HALF,
                 H_PAD: tl.constexpr, HALF_PAD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, H_PAD)
    i = tl.arange(0, HALF_PAD)
    i_ok = i < HALF
    ok = (h < H)[:, None] & i_ok[None, :]
    c = tl.load(cos_ptr + t * HALF + i, mask=i_ok, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + t * HALF + i, mask=i_ok, other=0.0).to(tl.float32)[None, :]
    off = t * H * 2 * HALF + h[:, None] * 2 * HALF + i[None, :]
    x1 = tl.load(x_ptr + off, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + off + HALF, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + off, (x1 * c - x2 * s).to(y_ptr.dtype.element_ty), mask=ok)
    tl.store(y_ptr + off + HALF, (x2 * c + x1 * s).to(y_ptr.dtype.element_ty), mask=ok)


def apply_rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x, cos, sin = _check(x, cos, sin)
    T, H, D = x.shape
    y = torch.empty_like(x)
    if x.numel():
        _rope_kernel[(T,)](x, cos, sin, y, H, D // 2, H_PAD=next_pow2(H), HALF_PAD=next_pow2(D // 2), num_warps=4)
    return y


def apply_rope_torch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x, cos, sin = _check(x, cos, sin)
    xf = x.to(torch.float32)
    x1, x2 = xf.chunk(2, dim=-1)
    c, s = cos.to(torch.float32)[:, None, :], sin.to(torch.float32)[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backend: str = "torch") -> torch.Tensor:
    """x [T, H, D], cos/sin [T, D/2] -> x rotated, half-split pairs (i, i + D/2)."""
    if check_backend(backend) == "triton":
        return apply_rope_triton(x, cos, sin)
    return apply_rope_torch(x, cos, sin)


def _check(x, cos, sin):
    check_float("x", x, 3)
    T, _, D = x.shape
    if D % 2:
        raise ValueError(f"apply_rope: head_dim {D} is odd")
    for name, t in (("cos", cos), ("sin", sin)):
        check_float(name, t, 2)
        if t.shape != (T, D // 2):
            raise ValueError(f"apply_rope: {name} must be [{T}, {D // 2}], got {tuple(t.shape)}")
    return x.contiguous(), cos.contiguous(), sin.contiguous()
