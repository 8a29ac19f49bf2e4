"""Rotary embedding, half-split (NeoX) rotation with given cos/sin (DESIGN §7, YaRN).

    x [T, H, D] (fp32 / bf16)    cos, sin [T, D/2] fp32 (YaRN mscale already applied)
    -> [T, H, D] in x's dtype:   x1, x2 = x[..., :D/2], x[..., D/2:]
                                 out = [x1 cos - x2 sin, x2 cos + x1 sin]   (fp32 math)

Purely elementwise: one program per token, all heads in one [H_PAD, D/2_PAD] tile, so there
is no reduction and nothing can depend on the batch. engine.rope computes cos/sin;
apply_rope_portable below is the bit-exact torch reference.
"""

from __future__ import annotations

import torch
from lockstep.kernels import _common  # noqa: F401  (first: it sets TRITON_INTERPRET before triton is imported)
import triton
import triton.language as tl

from lockstep.kernels import portable
from lockstep.kernels._common import check_float, next_pow2
from lockstep.kernels.case import KernelCase
from lockstep.kernels.portable_tl import cast_rne


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
    tl.store(y_ptr + off, cast_rne(x1 * c - x2 * s, y_ptr.dtype.element_ty), mask=ok)
    tl.store(y_ptr + off + HALF, cast_rne(x2 * c + x1 * s, y_ptr.dtype.element_ty), mask=ok)


def apply_rope_triton(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x, cos, sin = _check(x, cos, sin)
    T, H, D = x.shape
    y = torch.empty_like(x)
    if x.numel():
        _rope_kernel[(T,)](x, cos, sin, y, H, D // 2, H_PAD=next_pow2(H), HALF_PAD=next_pow2(D // 2), num_warps=4,
                           enable_fp_fusion=True)
    return y


# The KV head count and the int64 slot/position pointers are not specialized: they only index the
# caches (integer address math); every float operation is the same. HQ and HALF (the q loads') are.
@triton.jit(do_not_specialize=["HKV", "slot_ptr", "pos_ptr"])
def _rope_qkv_cache_kernel(qkv_ptr, cos_ptr, sin_ptr, q_ptr, kc_ptr, vc_ptr, slot_ptr, pos_ptr,
                           HQ, HKV, S, HALF, HQ_PAD: tl.constexpr, HKV_PAD: tl.constexpr,
                           HALF_PAD: tl.constexpr):
    # one program per token t: its q heads rotated into q [T, HQ, D], its k heads rotated and its
    # v heads copied into the caches [slots, HKV, S, D] at (slot[t], pos[t]); qkv [T, (HQ + 2 HKV) * D]
    t = tl.program_id(0).to(tl.int64)
    D = 2 * HALF
    row = qkv_ptr + t * (HQ + 2 * HKV) * D
    i = tl.arange(0, HALF_PAD)
    i_ok = i < HALF
    c = tl.load(cos_ptr + t * HALF + i, mask=i_ok, other=0.0).to(tl.float32)[None, :]
    s = tl.load(sin_ptr + t * HALF + i, mask=i_ok, other=0.0).to(tl.float32)[None, :]
    hq = tl.arange(0, HQ_PAD)
    ok = (hq < HQ)[:, None] & i_ok[None, :]
    src = row + hq[:, None] * D + i[None, :]
    x1 = tl.load(src, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=ok, other=0.0).to(tl.float32)
    dst = q_ptr + t * HQ * D + hq[:, None] * D + i[None, :]
    tl.store(dst, cast_rne(x1 * c - x2 * s, q_ptr.dtype.element_ty), mask=ok)
    tl.store(dst + HALF, cast_rne(x2 * c + x1 * s, q_ptr.dtype.element_ty), mask=ok)
    slot = tl.load(slot_ptr + t)
    pos = tl.load(pos_ptr + t)
    hk = tl.arange(0, HKV_PAD)
    ok = (hk < HKV)[:, None] & i_ok[None, :]
    src = row + (HQ + hk[:, None]) * D + i[None, :]
    x1 = tl.load(src, mask=ok, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=ok, other=0.0).to(tl.float32)
    dst = ((slot * HKV + hk[:, None]) * S + pos) * D + i[None, :]
    tl.store(kc_ptr + dst, cast_rne(x1 * c - x2 * s, kc_ptr.dtype.element_ty), mask=ok)
    tl.store(kc_ptr + dst + HALF, cast_rne(x2 * c + x1 * s, kc_ptr.dtype.element_ty), mask=ok)
    src = src + HKV * D                                   # the v heads follow the k heads
    tl.store(vc_ptr + dst, tl.load(src, mask=ok, other=0.0).to(vc_ptr.dtype.element_ty), mask=ok)
    tl.store(vc_ptr + dst + HALF, tl.load(src + HALF, mask=ok, other=0.0).to(vc_ptr.dtype.element_ty), mask=ok)


def rope_qkv_cache_triton(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                          v_cache: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                          q_heads: int) -> torch.Tensor:
    """The fused qkv projection's output [T, (Hq + 2 Hkv) * D] -> q [T, Hq, D] rotated, in the
    caches' dtype; k rotated and v written into k_cache / v_cache [slots, Hkv, S, D] at
    (slots[t], positions[t]). The same operations, one rounding each (no fused multiply-add),
    as apply_rope_portable on q and k followed by the cache write (engine/model.py)."""
    T = qkv.shape[0]
    _, Hkv, S, D = k_cache.shape
    if qkv.dim() != 2 or qkv.shape[1] != (q_heads + 2 * Hkv) * D or v_cache.shape != k_cache.shape:
        raise ValueError(f"rope_qkv_cache: qkv {tuple(qkv.shape)} does not fit {q_heads} q heads and caches "
                         f"{tuple(k_cache.shape)} / {tuple(v_cache.shape)}")
    if cos.shape != (T, D // 2) or sin.shape != (T, D // 2) or slots.shape != (T,) or positions.shape != (T,):
        raise ValueError(f"rope_qkv_cache: cos/sin must be [{T}, {D // 2}] and slots/positions [{T}]")
    q = torch.empty((T, q_heads, D), dtype=k_cache.dtype, device=qkv.device)
    if T:
        _rope_qkv_cache_kernel[(T,)](qkv.contiguous(), cos.contiguous(), sin.contiguous(), q, k_cache, v_cache,
                                     slots.contiguous(), positions.contiguous(), q_heads, Hkv, S, D // 2,
                                     HQ_PAD=next_pow2(q_heads), HKV_PAD=next_pow2(Hkv),
                                     HALF_PAD=next_pow2(D // 2), num_warps=4, enable_fp_fusion=False)
    return q


# --------------------------------------------------------------------------- torch reference
def apply_rope_portable(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The bit-exact reference: x [T, heads, D], cos / sin [T, D/2] fp32 -> x rotated, in the
    promoted dtype (fp32 for fp32 cos / sin); the halves x[:D/2], x[D/2:] form the pairs, each
    product and sum one IEEE operation (the same bits on every machine). The torch ops table's
    RoPE (engine/model.py), the operations the fused rope_qkv_cache_triton does one by one, and
    the rope kernel specs' reference."""
    x1, x2 = x.chunk(2, dim=-1)                     # [T, heads, D/2] each
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


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


# --------------------------------------------------------------------------- the kernel spec's case
def _rope_op(x, cos, sin):
    return apply_rope_triton(x, cos, sin)


def _rope_inputs(inp, s, d):
    x, ang = d.normal(s["T"], s["H"], s["D"], scale=inp["scale"]), d.normal(s["T"], s["D"] // 2, scale=100.0,
                                                                          dtype=torch.float32)
    sin, cos = portable.sincos64(ang)
    return {"x": x, "cos": cos.to(torch.float32) * 1.3466, "sin": sin.to(torch.float32) * 1.3466}


CASES = (KernelCase(
    name="rope", dims=("T", "H", "D"), inputs=_rope_inputs, op=_rope_op,
    call=lambda op, x, r, offered: op(x["x"][r], x["cos"][r], x["sin"][r]),
    # the model's call: fp32, rounded once
    reference=lambda x: apply_rope_portable(x["x"].to(torch.float32), x["cos"], x["sin"]).to(x["x"].dtype),
    elements=lambda s: 3 * s["T"] * s["H"] * s["D"] + s["T"] * s["D"],
    problems=lambda inp, s: [(("shape", "D"), "D must be even")] if s["D"] % 2 else [],
    note="lockstep.kernels.rope.apply_rope_triton"),)
