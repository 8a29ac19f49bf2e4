"""gpt-oss attention with sinks, sliding window and GQA, read from the KV cache (DESIGN §7, §8).

    q [T, Hq, D]    k_cache, v_cache [slots, Hkv, S, D]    slots, positions [T] int64
    sinks [Hq]      window (0 = full causal)               scale            -> out [T, Hq, D]

Query head h uses KV head h // G (G = Hq / Hkv). Token t at position p = positions[t] in slot
s = slots[t] sees keys j of slot s with j <= p, and j >= p - window + 1 if window > 0:

    out = sum_j softmax([q.k_j * scale ..., sink_h])_j * v_j    (sink column dropped after)

The layout is engine.attention's (the cache is written before attention runs, so a token of
a prefill sees the keys of the whole prompt in its slot and masks the future ones).

One kernel serves prefill, chunked prefill, decode and verify: one program per (token, KV
head) holds the G query heads of that KV head as the rows of its tile and walks the keys in
fixed, absolutely aligned BLOCK_KV = 64 tiles, first to last, with the online-softmax merge.
Which tiles it visits depends only on p and the window (full: tiles 0 … p // 64; sliding:
the N_WIN = (window - 1) // 64 + 2 tiles ending at p's tile, starting no lower than tile 0),
and key/value loads are masked to the visible keys, so a position's bits do not depend on
the batch (D2) or on how the prompt was chunked (D3).

Empty tiles (DESIGN §8): with window 128, every position p >= 191 with p = 63 mod 64 visits a
tile wholly before its window (p = 191: tiles 0, 1, 2 and the window starts at 64), so any
prompt of 192+ tokens has one. Its logits are all -inf; the
merge uses m_use = 0 where the running max is still -inf, so exp(m - m_use) = 0 and
p = exp(-inf) = 0: the tile contributes nothing and never NaN. (The seed bug used m_new
itself: exp(-inf - (-inf)) = NaN.) The sink is merged after the last tile the same way, and a
row with neither keys nor a finite sink comes out 0 (a NaN from the inputs still shows).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import check_backend
from kernels._common import PORTABLE_MATH, USE_DOT, check_float, next_pow2
from kernels.portable_tl import cast_rne, exp_f32

BLOCK_KV = 64          # the fixed KV split size, for prefill and decode alike
_GUARD_EMPTY_TILES = True   # only tests turn this off, to show the specs catch the seed bug


@triton.jit
def _attention_kernel(q_ptr, k_ptr, v_ptr, slot_ptr, pos_ptr, sink_ptr, o_ptr,
                      Hq, Hkv, S, D, WINDOW, N_WIN, scale,
                      G: tl.constexpr, G_PAD: tl.constexpr, D_PAD: tl.constexpr,
                      BLOCK_KV: tl.constexpr, SLIDING: tl.constexpr,
                      USE_DOT: tl.constexpr, GUARD: tl.constexpr, PORTABLE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)                   # token
    h = tl.program_id(1).to(tl.int64)                   # KV head
    slot = tl.load(slot_ptr + t)
    pos = tl.load(pos_ptr + t)
    g = tl.arange(0, G_PAD)                             # query head h * G + g
    d = tl.arange(0, D_PAD)
    g_ok = g < G
    d_ok = d < D
    q_rows = q_ptr + t * Hq * D + (h * G + g)[:, None] * D + d[None, :]
    q = tl.load(q_rows, mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)  # [G_PAD, D_PAD]
    kv_base = (slot * Hkv + h) * S * D

    tile_hi = pos // BLOCK_KV
    if SLIDING:
        lo = pos - WINDOW + 1
        tile_lo = tl.maximum(tile_hi - N_WIN + 1, 0)
    else:
        lo = pos * 0
        tile_lo = pos * 0
    m_i = tl.full((G_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((G_PAD,), dtype=tl.float32)
    acc = tl.zeros((G_PAD, D_PAD), dtype=tl.float32)
    for tile in range(tile_lo, tile_hi + 1):
        j = tile * BLOCK_KV + tl.arange(0, BLOCK_KV)    # [BLOCK_KV] key positions
        vis = (j >= lo) & (j <= pos) & (j < S)
        kv_off = kv_base + j[:, None] * D + d[None, :]
        kv_mask = vis[:, None] & d_ok[None, :]
        kt = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)   # [BLOCK_KV, D_PAD]
        vt = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
        if USE_DOT:
            s = tl.dot(q, tl.trans(kt), input_precision="ieee")                 # [G_PAD, BLOCK_KV]
        else:
            s = tl.sum(q[:, None, :] * kt[None, :, :], axis=2)
        s = tl.where(vis[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        if GUARD:
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)   # empty so far: no NaN
        else:
            m_use = m_new                                            # the seed bug
        alpha = exp_f32(m_i - m_use, PORTABLE)
        p = exp_f32(s - m_use[:, None], PORTABLE)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if USE_DOT:
            pv = tl.dot(p, vt, input_precision="ieee")                          # [G_PAD, D_PAD]
        else:
            pv = tl.sum(p[:, :, None] * vt[None, :, :], axis=1)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    sink = tl.load(sink_ptr + h * G + g, mask=g_ok, other=float("-inf")).to(tl.float32)
    m_f = tl.maximum(m_i, sink)
    m_fu = tl.where(m_f == float("-inf"), 0.0, m_f)
    alpha = exp_f32(m_i - m_fu, PORTABLE)
    l_i = l_i * alpha + exp_f32(sink - m_fu, PORTABLE)
    acc = acc * alpha[:, None]
    empty = l_i == 0.0                                  # no key and no finite sink: 0, not 0/0
    out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l_i)[:, None])  # NaN stays NaN
    o_rows = o_ptr + t * Hq * D + (h * G + g)[:, None] * D + d[None, :]
    tl.store(o_rows, cast_rne(out, o_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])


def _window_tiles(window: int) -> int:
    return (window - 1) // BLOCK_KV + 2 if window > 0 else 0


def attention_triton(q, k_cache, v_cache, slots, positions, sinks, window: int, scale: float) -> torch.Tensor:
    q, k_cache, v_cache, slots, positions, sinks = _check(q, k_cache, v_cache, slots, positions, sinks, window)
    T, Hq, D = q.shape
    _, Hkv, S, _ = k_cache.shape
    G = Hq // Hkv
    out = torch.empty_like(q)
    if T == 0:
        return out
    g_pad = max(16, next_pow2(G)) if USE_DOT else next_pow2(G)
    d_pad = max(16, next_pow2(D))
    _attention_kernel[(T, Hkv)](q, k_cache, v_cache, slots, positions, sinks, out,
                                Hq, Hkv, S, D, int(window), _window_tiles(window), float(scale),
                                G=G, G_PAD=g_pad, D_PAD=d_pad, BLOCK_KV=BLOCK_KV, SLIDING=window > 0,
                                USE_DOT=USE_DOT, GUARD=_GUARD_EMPTY_TILES, PORTABLE=PORTABLE_MATH,
                                num_warps=4, num_stages=1)
    return out


def attention_torch(q, k_cache, v_cache, slots, positions, sinks, window: int, scale: float) -> torch.Tensor:
    """Plain reference: whole score rows, mask, sink column, softmax, drop the sink, times V."""
    q, k_cache, v_cache, slots, positions, sinks = _check(q, k_cache, v_cache, slots, positions, sinks, window)
    T, Hq, D = q.shape
    _, Hkv, S, _ = k_cache.shape
    G = Hq // Hkv
    k = k_cache.index_select(0, slots).to(torch.float32)                       # [T, Hkv, S, D]
    v = v_cache.index_select(0, slots).to(torch.float32)
    qf = q.to(torch.float32).reshape(T, Hkv, G, D)
    s = torch.einsum("thgd,thsd->thgs", qf, k) * scale                          # [T, Hkv, G, S]
    j = torch.arange(S, device=q.device)
    vis = j[None, :] <= positions[:, None]                                      # [T, S]
    if window > 0:
        vis = vis & (j[None, :] > positions[:, None] - window)
    s = s.masked_fill(~vis[:, None, None, :], float("-inf"))
    sink = sinks.to(torch.float32).reshape(1, Hkv, G, 1).expand(T, Hkv, G, 1)
    full = torch.cat([s, sink], dim=-1)
    m = full.amax(dim=-1, keepdim=True)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    e = torch.exp(full - m)
    total = e.sum(dim=-1, keepdim=True)
    probs = torch.where(total > 0, e / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(e))
    out = torch.einsum("thgs,thsd->thgd", probs[..., :S], v)                   # sink dropped
    return out.reshape(T, Hq, D).to(q.dtype)


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
              positions: torch.Tensor, sinks: torch.Tensor, window: int, scale: float,
              backend: str = "torch") -> torch.Tensor:
    """q [T, Hq, D]; k_cache, v_cache [slots, Hkv, S, D]; slots, positions [T] int64;
    sinks [Hq]; window 0 = full causal -> [T, Hq, D] in q's dtype (fp32 math)."""
    if check_backend(backend) == "triton":
        return attention_triton(q, k_cache, v_cache, slots, positions, sinks, window, scale)
    return attention_torch(q, k_cache, v_cache, slots, positions, sinks, window, scale)


def _check(q, k_cache, v_cache, slots, positions, sinks, window):
    check_float("q", q, 3)
    check_float("k_cache", k_cache, 4)
    check_float("v_cache", v_cache, 4)
    if k_cache.shape != v_cache.shape or k_cache.shape[3] != q.shape[2]:
        raise ValueError(f"attention: k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)} "
                         f"and q {tuple(q.shape)} do not fit [slots, Hkv, S, D] / [T, Hq, D]")
    Hq, Hkv = q.shape[1], k_cache.shape[1]
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"attention: {Hq} query heads are not a multiple of {Hkv} KV heads")
    for name, t in (("slots", slots), ("positions", positions)):
        if t.dtype != torch.int64 or t.shape != (q.shape[0],):
            raise ValueError(f"attention: {name} must be int64 [{q.shape[0]}], got {t.dtype} {tuple(t.shape)}")
    if sinks.shape != (Hq,):
        raise ValueError(f"attention: sinks must be [{Hq}], got {tuple(sinks.shape)}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"attention: window must be an int >= 0, got {window!r}")
    return (q.contiguous(), k_cache.contiguous(), v_cache.contiguous(), slots.contiguous(),
            positions.contiguous(), sinks.contiguous())
