"""gpt-oss attention with sinks, sliding window and GQA, read from the KV cache (DESIGN §7, §8).

    q [T, Hq, D]    k_cache, v_cache [slots, Hkv, S, D]    slots, positions [T] int64
    sinks [Hq]      window (0 = full causal)               scale            -> out [T, Hq, D]

Query head h uses KV head h // G (G = Hq / Hkv). Token t at position p = positions[t] in slot
s = slots[t] sees keys j of slot s with j <= p, and j >= p - window + 1 if window > 0:

    out = sum_j softmax([q.k_j * scale ..., sink_h])_j * v_j    (sink column dropped after)

The cache is written before attention runs, so a token of a prefill sees the keys of the whole
prompt in its slot and masks the future ones. attention_portable (the end of this module) is the
bit-exact torch reference: the torch ops run it, and the kernel specs compare against it.

One set of kernels serves prefill, chunked prefill, decode and verify. Keys are walked in fixed,
absolutely aligned BLOCK_KV = 64 tiles, and the tiles are grouped into fixed, absolutely aligned
splits of SPLIT = 1024 keys (16 tiles; split k holds keys k*1024 … k*1024 + 1023, the last split
of the cache's capacity also every tile past it). For one (token, KV head), holding the G query
heads of that KV head as the rows of its tile:

  1. each split the token can see walks its tiles first to last from an empty state with the
     online-softmax merge, giving (m, l, acc) in fp32: the running max, the sum of exp(s - m)
     and the sum of exp(s - m) * v;
  2. the splits' states are merged first to last with the same guarded merge (the first split's
     state is taken as it is), then the sink is merged and acc is divided by l.

Which tiles and splits a token uses depends only on p and the window (full: tiles 0 … p // 64;
sliding: the N_WIN = (window - 1) // 64 + 2 tiles ending at p's tile, starting no lower than
tile 0; the splits are those from the first visible key's to p's, and a tile of the walk before
the first of them, wholly before the window, is not walked), and key/value loads are masked to
the visible keys, so a position's bits do not depend on the batch (D2) or on how the prompt was
chunked (D3). A position below SPLIT (every position of every golden recorded before splits
existed) has one split, and then the operations are exactly those of the single 64-key walk.

Rows. A program holds a block of rows: BLOCK_T tokens' G query heads of one KV head (row r is
head r % G_P of the block's token r // G_P). Compiled with bf16/fp16 q and cache, the block is
TC_ROWS = 64 rows and the two products run on tensor cores: q.k in the inputs' dtype with fp32
accumulation, and p.v as two products, p's hi and lo halves in v's dtype (p = hi + lo to ~16
bits), each into fp32. Each output element of a tensor-core product is one fixed sequence of
MMA instructions whatever the other rows hold, and the row sums run in the same layout for
every row of the block, so a row's bits depend on its own token only, provided the block shape
is the same: prefill, chunks, decode and verify all launch this one block shape.
Compiled fp32 keeps one token's rows (BLOCK_T = 1), the fp32 products and the walk of old (the
token's slot and position as scalars, no runs, no row masks; the split-K phase 1 walks so too,
its block holding one token). The interpreter takes INTERPRET_BLOCK_T = 16 tokens a block in
launches of 16 tokens or more (a prefill) and one token otherwise: it pays per operation, not
per row, and numpy computes each row on its own, so there a row's bits do not depend on its
block (tests/kernels/test_attention.py compares blocks with one token).

A program takes TPP consecutive tokens of the batch (TPP = BLOCK_T when that gives enough
programs, else 1: a decode token alone in its block, the other rows dead). A run of its tokens
that share a slot walks the union of their splits and tiles, each row masked to its own keys.
For a row, a tile or split outside its own is an exact no-op: a wholly masked tile leaves
(m, l, acc) unchanged (alpha = e^0 = 1, p = 0) or, before the row's first key, leaves the empty
state; a split outside its own merges as the empty state. The one exception is the sign of a
zero: a key another row of the run sees is loaded, and 0 * v adds -0 where v < 0, so an output
that is exactly zero may come out -0 in one launch and +0 in another. With BLOCK_T > 1, and in
every launch of the interpreter (whose block varies), every zero output is therefore written +0
(PLUS_ZERO), the same bits in every launch (DESIGN §8). A key another row sees holding inf or
NaN would give this row 0 * inf = NaN; keys beyond every row's position are never loaded.

Two launches compute the same operations, so they give the same bits; which one runs is a speed
choice made from shapes only (never from the positions, so no host read and a decode step can be
a CUDA graph):
  - one program per (TPP tokens, KV head) walks each run's splits one after the other and merges
    as it goes (prefill, where the programs already fill the GPU, windowed layers, and short caches);
  - split-K (flash-decoding style) for decode and verify with a long walk: phase 1 runs one
    program per (token, KV head, split index), the token's rows in the same row block, each
    storing its split's (m, l, acc) (G x D + 2G floats) to a scratch buffer; phase 2 runs one
    program per (token, KV head) that reads the token's splits back in order, merges them and the
    sink and stores the output. The grid's third dimension is the most splits any token of this
    cache and window can use; a program whose index is past its own token's last split walks nothing
    and stores nothing, and phase 2 reads only the token's own splits, so such a program cannot
    touch a result.

Empty tiles (DESIGN §8): with window 128, every position p >= 191 with p = 63 mod 64 visits a
tile wholly before its window (p = 191: tiles 0, 1, 2 and the window starts at 64), so any
prompt of 192+ tokens has one. Its logits are all -inf; the merge uses m_use = 0 where the
running max is still -inf, so exp(m - m_use) = 0 and p = exp(-inf) = 0: the tile contributes
nothing and never NaN. (The seed bug used m_new itself: exp(-inf - (-inf)) = NaN; tests pass
_guard=False to put it back.) After such a tile the state is exactly the empty one (-inf, +0,
+0), which is why leaving it out when it lies in an earlier split changes no bit. The splits'
merge and the sink's use the same guard, and a row with neither keys nor a finite sink comes
out 0 (a NaN from the inputs still shows).
"""

from __future__ import annotations

import torch
from lockstep.kernels import _common  # noqa: F401  (first: it sets TRITON_INTERPRET before triton is imported)
import triton
import triton.language as tl

from lockstep.kernels import portable
from lockstep.kernels._common import INTERPRET, PORTABLE_MATH, USE_DOT, check_float, next_pow2
from lockstep.kernels.case import KernelCase
from lockstep.kernels.portable import exp, tree_sum
from lockstep.kernels.portable_tl import cast_rne, exp_f32

BLOCK_KV = 64            # keys per tile, for prefill and decode alike
SPLIT = 1024             # keys per split: fixed, a multiple of BLOCK_KV (tests pass a smaller _split)
TWO_PHASE_BELOW = 1024   # split-K launch when T * Hkv programs are fewer than this (speed only)
TC_ROWS = 64             # rows of a tensor-core block: 64 // G_P tokens' query heads
BLOCK_TOKENS_MIN_PROGRAMS = 128   # below this many blocks, one token a program (speed only)
INTERPRET_BLOCK_T = 16   # the interpreter's tokens a block in long launches (it pays per operation)


@triton.jit
def _split_range(pos, WINDOW, N_WIN, N_CAP, SLIDING: tl.constexpr, BLOCK_KV: tl.constexpr,
                 TPS: tl.constexpr):
    """-> (lo, tile_lo, tile_hi, split_lo, split_hi) of the token at pos: its first visible key
    (window), the tiles of its walk and its first and last split (TPS tiles per split)."""
    tile_hi = pos // BLOCK_KV
    if SLIDING:
        lo = pos - WINDOW + 1
        tile_lo = tl.maximum(tile_hi - N_WIN + 1, 0)
    else:
        lo = pos * 0
        tile_lo = pos * 0
    first = tl.maximum(lo, 0) // BLOCK_KV                # the tile of the first visible key
    split_lo = tl.minimum(first // TPS, N_CAP - 1)
    split_hi = tl.minimum(tile_hi // TPS, N_CAP - 1)     # the capacity's last split takes the rest
    return lo, tile_lo, tile_hi, split_lo, split_hi


@triton.jit
def _split_tiles(s, tile_lo, tile_hi, N_CAP, TPS: tl.constexpr):
    """-> (first, last) tile of the walk inside split s (last < first: none)."""
    first = tl.maximum(tile_lo, s * TPS)
    last = tl.where(s == N_CAP - 1, tile_hi, tl.minimum(tile_hi, s * TPS + TPS - 1))
    return first, last


@triton.jit
def _walk(q, k_ptr, v_ptr, kv_base, d, d_ok, mine, lo, pos, lo_u, pos_u, tile_first, tile_last, S, D,
          scale, ROWS: tl.constexpr, D_PAD: tl.constexpr, BLOCK_KV: tl.constexpr,
          USE_DOT: tl.constexpr, TC: tl.constexpr, GUARD: tl.constexpr, PORTABLE: tl.constexpr,
          PER_ROW: tl.constexpr):
    """Online softmax of the rows over tiles tile_first … tile_last from the empty state -> (m, l, acc).
    PER_ROW: row r sees keys lo[r] … pos[r] if mine[r] (else none), and lo_u … pos_u spans every
    row's keys. Else every row is one token's and sees lo_u … pos_u (scalars; lo, pos, mine unused):
    the rows that are not stored compute on too, which no stored row reads."""
    m_i = tl.full((ROWS,), float("-inf"), tl.float32)
    l_i = tl.zeros((ROWS,), dtype=tl.float32)
    acc = tl.zeros((ROWS, D_PAD), dtype=tl.float32)
    for tile in range(tile_first, tile_last + 1):
        j = tile * BLOCK_KV + tl.arange(0, BLOCK_KV)    # [BLOCK_KV] key positions
        seen = (j >= lo_u) & (j <= pos_u) & (j < S)     # keys some row sees: the others load as 0
        if PER_ROW:
            vis = mine[:, None] & (j[None, :] >= lo[:, None]) & (j[None, :] <= pos[:, None]) & seen[None, :]
        else:
            vis = seen[None, :]
        kv_off = kv_base + j[:, None] * D + d[None, :]
        kv_mask = seen[:, None] & d_ok[None, :]
        kt = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0)                   # [BLOCK_KV, D_PAD]
        vt = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0)
        if TC:
            s = tl.dot(q, tl.trans(kt))                                          # [ROWS, BLOCK_KV]
        elif USE_DOT:
            s = tl.dot(q, tl.trans(kt.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.sum(q[:, None, :] * kt.to(tl.float32)[None, :, :], axis=2)
        s = tl.where(vis, s * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        if GUARD:
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)   # empty so far: no NaN
        else:
            m_use = m_new                                            # the seed bug
        alpha = exp_f32(m_i - m_use, PORTABLE)
        p = exp_f32(s - m_use[:, None], PORTABLE)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if TC:              # p = hi + lo in v's dtype: two tensor-core products keep ~16 bits of p
            p_hi = p.to(vt.dtype)
            p_lo = (p - p_hi.to(tl.float32)).to(vt.dtype)
            pv = tl.dot(p_lo, vt, tl.dot(p_hi, vt))                              # [ROWS, D_PAD]
        elif USE_DOT:
            pv = tl.dot(p, vt.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.sum(p[:, :, None] * vt.to(tl.float32)[None, :, :], axis=1)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _merge(m_a, l_a, acc_a, m_b, l_b, acc_b, GUARD: tl.constexpr, PORTABLE: tl.constexpr):
    """State a, then split b after it: the tile merge's guard, with b's sums in place of a tile's."""
    m_new = tl.maximum(m_a, m_b)
    if GUARD:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    alpha = exp_f32(m_a - m_use, PORTABLE)
    beta = exp_f32(m_b - m_use, PORTABLE)
    return m_new, l_a * alpha + l_b * beta, acc_a * alpha[:, None] + acc_b * beta[:, None]


@triton.jit
def _finish(m_i, l_i, acc, sink, PLUS_ZERO: tl.constexpr, PORTABLE: tl.constexpr):
    """Merge the sink column, then acc / l (a row with no key and no finite sink: 0). PLUS_ZERO:
    a zero comes out +0 (module docstring: a key another row of the block sees adds 0 * v = ±0)."""
    m_f = tl.maximum(m_i, sink)
    m_fu = tl.where(m_f == float("-inf"), 0.0, m_f)
    alpha = exp_f32(m_i - m_fu, PORTABLE)
    l_i = l_i * alpha + exp_f32(sink - m_fu, PORTABLE)
    acc = acc * alpha[:, None]
    empty = l_i == 0.0                                  # no key and no finite sink: 0, not 0/0
    out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, l_i)[:, None])  # NaN stays NaN
    if PLUS_ZERO:
        out = tl.where(out == 0.0, 0.0, out)
    return out


@triton.jit
def _rows(t0, TPP, T, G: tl.constexpr, G_P: tl.constexpr, BLOCK_T: tl.constexpr):
    """The program's rows: row r is query head g = r % G_P (of its KV head) of token t0 + r // G_P,
    live if that token is one of the program's TPP and g < G. -> (i, g, token, live) [ROWS]."""
    r = tl.arange(0, BLOCK_T * G_P)
    i = r // G_P
    g = r % G_P
    tok = t0 + i
    return i, g, tok, (i < TPP) & (tok < T) & (g < G)


@triton.jit
def _walk_splits(q, k_ptr, v_ptr, kv_base, d, d_ok, mine, lo, pos, lo_u, pos_u, tile_lo, tile_hi,
                 split_lo, split_hi, N_CAP, S, D, scale, ROWS: tl.constexpr, D_PAD: tl.constexpr,
                 BLOCK_KV: tl.constexpr, TPS: tl.constexpr, USE_DOT: tl.constexpr, TC: tl.constexpr,
                 GUARD: tl.constexpr, PORTABLE: tl.constexpr, PER_ROW: tl.constexpr):
    """Splits split_lo … split_hi, each walked from the empty state, merged first to last -> (m, l, acc)."""
    first, last = _split_tiles(split_lo, tile_lo, tile_hi, N_CAP, TPS)
    m_i, l_i, acc = _walk(q, k_ptr, v_ptr, kv_base, d, d_ok, mine, lo, pos, lo_u, pos_u, first, last, S, D,
                          scale, ROWS, D_PAD, BLOCK_KV, USE_DOT, TC, GUARD, PORTABLE, PER_ROW)
    for sp in range(split_lo + 1, split_hi + 1):
        first, last = _split_tiles(sp, tile_lo, tile_hi, N_CAP, TPS)
        m_b, l_b, acc_b = _walk(q, k_ptr, v_ptr, kv_base, d, d_ok, mine, lo, pos, lo_u, pos_u, first, last,
                                S, D, scale, ROWS, D_PAD, BLOCK_KV, USE_DOT, TC, GUARD, PORTABLE, PER_ROW)
        m_i, l_i, acc = _merge(m_i, l_i, acc, m_b, l_b, acc_b, GUARD, PORTABLE)
    return m_i, l_i, acc


# Token counts, head counts, windows and the int64 slot/position pointers are not specialized (one
# compile for every batch): they only index and mask; no float operation or its order depends on them.
_SHAPE_ARGS = ["T", "TPP", "Hkv", "WINDOW", "N_WIN", "N_CAP", "slot_ptr", "pos_ptr"]


@triton.jit(do_not_specialize=_SHAPE_ARGS)
def _attention_kernel(q_ptr, k_ptr, v_ptr, slot_ptr, pos_ptr, sink_ptr, o_ptr,
                      T, TPP, Hq, Hkv, S, D, WINDOW, N_WIN, N_CAP, scale,
                      G: tl.constexpr, G_P: tl.constexpr, BLOCK_T: tl.constexpr, D_PAD: tl.constexpr,
                      BLOCK_KV: tl.constexpr, TPS: tl.constexpr, SLIDING: tl.constexpr,
                      USE_DOT: tl.constexpr, TC: tl.constexpr, GUARD: tl.constexpr,
                      PLUS_ZERO: tl.constexpr, PORTABLE: tl.constexpr):
    """One program per (TPP consecutive tokens, KV head). Each run of tokens sharing a slot walks
    the union of its tokens' splits and tiles (the other rows masked), then stores its rows."""
    t0 = tl.program_id(0).to(tl.int64) * TPP
    h = tl.program_id(1).to(tl.int64)                   # KV head
    i, g, tok, live = _rows(t0, TPP, T, G, G_P, BLOCK_T)
    d = tl.arange(0, D_PAD)
    d_ok = d < D
    q_off = tok[:, None] * Hq * D + (h * G + g)[:, None] * D + d[None, :]
    q = tl.load(q_ptr + q_off, mask=live[:, None] & d_ok[None, :], other=0.0)  # [ROWS, D_PAD]
    if not TC:
        q = q.to(tl.float32)
    sink = tl.load(sink_ptr + h * G + g, mask=g < G, other=float("-inf")).to(tl.float32)
    if BLOCK_T == 1:    # one token (TPP = 1): its slot and position as scalars, no runs, no row masks
        pos = tl.load(pos_ptr + t0)
        kv_base = (tl.load(slot_ptr + t0) * Hkv + h) * S * D
        lo, tile_lo, tile_hi, split_lo, split_hi = _split_range(pos, WINDOW, N_WIN, N_CAP, SLIDING, BLOCK_KV, TPS)
        m_i, l_i, acc = _walk_splits(q, k_ptr, v_ptr, kv_base, d, d_ok, live, lo, pos, lo, pos, tile_lo,
                                     tile_hi, split_lo, split_hi, N_CAP, S, D, scale, BLOCK_T * G_P, D_PAD,
                                     BLOCK_KV, TPS, USE_DOT, TC, GUARD, PORTABLE, False)
        out = _finish(m_i, l_i, acc, sink, PLUS_ZERO, PORTABLE)
        tl.store(o_ptr + q_off, cast_rne(out, o_ptr.dtype.element_ty), mask=live[:, None] & d_ok[None, :])
    else:
        slot = tl.load(slot_ptr + tok, mask=live, other=0)
        pos = tl.load(pos_ptr + tok, mask=live, other=0)
        prev = tl.load(slot_ptr + tok - 1, mask=live & (i > 0), other=0)
        run = tl.cumsum((live & (i > 0) & (g == 0) & (slot != prev)).to(tl.int32), axis=0)   # run of each row
        lo, tile_lo, tile_hi, split_lo, split_hi = _split_range(pos, WINDOW, N_WIN, N_CAP, SLIDING, BLOCK_KV, TPS)
        for run_i in range(0, tl.max(tl.where(live, run, 0), axis=0) + 1):
            mine = live & (run == run_i)
            kv_base = (tl.max(tl.where(mine, slot, 0), axis=0) * Hkv + h) * S * D
            m_i, l_i, acc = _walk_splits(
                q, k_ptr, v_ptr, kv_base, d, d_ok, mine, lo, pos,
                tl.min(tl.where(mine, lo, S), axis=0), tl.max(tl.where(mine, pos, -1), axis=0),
                tl.min(tl.where(mine, tile_lo, N_CAP * TPS), axis=0), tl.max(tl.where(mine, tile_hi, 0), axis=0),
                tl.min(tl.where(mine, split_lo, N_CAP), axis=0), tl.max(tl.where(mine, split_hi, 0), axis=0),
                N_CAP, S, D, scale, BLOCK_T * G_P, D_PAD, BLOCK_KV, TPS, USE_DOT, TC, GUARD, PORTABLE, True)
            out = _finish(m_i, l_i, acc, sink, PLUS_ZERO, PORTABLE)
            tl.store(o_ptr + q_off, cast_rne(out, o_ptr.dtype.element_ty), mask=mine[:, None] & d_ok[None, :])


@triton.jit(do_not_specialize=[a for a in _SHAPE_ARGS if a != "TPP"] + ["NG"])
def _attention_split_kernel(q_ptr, k_ptr, v_ptr, slot_ptr, pos_ptr, m_ptr, l_ptr, acc_ptr,
                            T, Hq, Hkv, S, D, WINDOW, N_WIN, N_CAP, NG, scale,
                            G: tl.constexpr, G_P: tl.constexpr, BLOCK_T: tl.constexpr,
                            D_PAD: tl.constexpr, BLOCK_KV: tl.constexpr, TPS: tl.constexpr,
                            SLIDING: tl.constexpr, USE_DOT: tl.constexpr, TC: tl.constexpr,
                            GUARD: tl.constexpr, PORTABLE: tl.constexpr):
    """Phase 1, one program per (token, KV head, z), the token's rows in the one-phase kernel's row
    block: split split_lo + z of the token, if it has one, -> its (m, l, acc) at [t, h, z] of the
    scratch buffers ([T, Hkv, NG, G] and [.., G, D])."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    z = tl.program_id(2).to(tl.int64)
    i, g, tok, live = _rows(t, 1, T, G, G_P, BLOCK_T)
    d = tl.arange(0, D_PAD)
    d_ok = d < D
    slot = tl.load(slot_ptr + t)
    pos = tl.load(pos_ptr + t)
    q_off = tok[:, None] * Hq * D + (h * G + g)[:, None] * D + d[None, :]
    q = tl.load(q_ptr + q_off, mask=live[:, None] & d_ok[None, :], other=0.0)
    if not TC:
        q = q.to(tl.float32)
    kv_base = (slot * Hkv + h) * S * D
    lo, tile_lo, tile_hi, split_lo, split_hi = _split_range(pos, WINDOW, N_WIN, N_CAP, SLIDING, BLOCK_KV, TPS)
    sp = split_lo + z
    mine = sp <= split_hi                               # else: past this token's last split
    first, last = _split_tiles(sp, tile_lo, tile_hi, N_CAP, TPS)
    last = tl.where(mine, last, first - 1)              # walk nothing
    m_i, l_i, acc = _walk(q, k_ptr, v_ptr, kv_base, d, d_ok, live, lo, pos, lo, pos, first, last, S, D,
                          scale, BLOCK_T * G_P, D_PAD, BLOCK_KV, USE_DOT, TC, GUARD, PORTABLE, False)
    row = ((t * Hkv + h) * NG + z) * G + g              # [ROWS]
    ok = live & (sp + g * 0 <= split_hi)                # and store nothing
    tl.store(m_ptr + row, m_i, mask=ok)
    tl.store(l_ptr + row, l_i, mask=ok)
    tl.store(acc_ptr + row[:, None] * D + d[None, :], acc, mask=ok[:, None] & d_ok[None, :])


@triton.jit(do_not_specialize=["Hkv", "WINDOW", "N_WIN", "N_CAP", "NG", "pos_ptr"])
def _attention_merge_kernel(pos_ptr, sink_ptr, m_ptr, l_ptr, acc_ptr, o_ptr,
                            Hq, Hkv, D, WINDOW, N_WIN, N_CAP, NG,
                            G: tl.constexpr, G_PAD: tl.constexpr, D_PAD: tl.constexpr,
                            BLOCK_KV: tl.constexpr, TPS: tl.constexpr, SLIDING: tl.constexpr,
                            PLUS_ZERO: tl.constexpr, GUARD: tl.constexpr, PORTABLE: tl.constexpr):
    """Phase 2, one program per (token, KV head): its splits' states first to last, then the sink
    (elementwise, so its own G_PAD-row block gives the one-phase kernel's bits)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    pos = tl.load(pos_ptr + t)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    g_ok = g < G
    d_ok = d < D
    acc_mask = g_ok[:, None] & d_ok[None, :]
    _, _, _, split_lo, split_hi = _split_range(pos, WINDOW, N_WIN, N_CAP, SLIDING, BLOCK_KV, TPS)
    row = (t * Hkv + h) * NG * G + g                    # split index 0 of this (token, KV head)
    m_i = tl.load(m_ptr + row, mask=g_ok, other=float("-inf"))
    l_i = tl.load(l_ptr + row, mask=g_ok, other=0.0)
    acc = tl.load(acc_ptr + row[:, None] * D + d[None, :], mask=acc_mask, other=0.0)
    for z in range(1, split_hi - split_lo + 1):
        rz = row + z * G
        m_b = tl.load(m_ptr + rz, mask=g_ok, other=float("-inf"))
        l_b = tl.load(l_ptr + rz, mask=g_ok, other=0.0)
        acc_b = tl.load(acc_ptr + rz[:, None] * D + d[None, :], mask=acc_mask, other=0.0)
        m_i, l_i, acc = _merge(m_i, l_i, acc, m_b, l_b, acc_b, GUARD, PORTABLE)

    sink = tl.load(sink_ptr + h * G + g, mask=g_ok, other=float("-inf")).to(tl.float32)
    out = _finish(m_i, l_i, acc, sink, PLUS_ZERO, PORTABLE)
    o_rows = o_ptr + t * Hq * D + (h * G + g)[:, None] * D + d[None, :]
    tl.store(o_rows, cast_rne(out, o_ptr.dtype.element_ty), mask=acc_mask)


def _window_tiles(window: int) -> int:
    return (window - 1) // BLOCK_KV + 2 if window > 0 else 0


def split_grid(S: int, window: int, split: int = SPLIT) -> int:
    """The most splits one token can use in a cache of capacity S with this window (the split-K
    grid's third dimension): every split of the capacity for full attention; for a window, the
    splits its window keys can touch, (window - 1) // split + 2, and no more than the capacity's."""
    n_cap = max(1, -(-S // split))
    return n_cap if window == 0 else min(n_cap, (window - 1) // split + 2)


def row_block(G: int, dtype: torch.dtype, block_t: int | None = None) -> tuple[bool, int, int]:
    """(TC, G_P, BLOCK_T) of a launch: whether the products run on tensor cores, the rows per token
    and the tokens per row block (module docstring). Compiled bf16/fp16 takes tensor cores with
    TC_ROWS rows; fp32 one token's rows (block_t: tests only, not TC; the interpreter's own choice:
    attention_triton)."""
    tc = USE_DOT and dtype in (torch.bfloat16, torch.float16) and block_t is None
    if tc:
        g_p = next_pow2(G)
        return True, g_p, max(1, TC_ROWS // g_p)
    return False, (max(16, next_pow2(G)) if USE_DOT else next_pow2(G)), block_t or 1


def _blocks_pay(T: int, Hkv: int, block_t: int) -> bool:
    """Whether to take block_t tokens a program (speed only: a row's bits are the same either way),
    from shapes alone (no host read, so a decode step can be a CUDA graph). Compiled: when that
    still gives the GPU enough programs. The interpreter pays per operation: for a launch of a
    whole block of tokens or more (a prefill; a decode batch that large, each token in its own
    slot, walks once per token in bigger rows and gains nothing)."""
    if T < 2 or block_t < 2:
        return False
    if INTERPRET:
        return T >= block_t
    return -(-T // block_t) * Hkv >= BLOCK_TOKENS_MIN_PROGRAMS


def attention_triton(q, k_cache, v_cache, slots, positions, sinks, window: int, scale: float, *,
                     _guard: bool = True, _split: int = SPLIT, _two_phase: bool | None = None,
                     _tokens: int | None = None, _block_t: int | None = None) -> torch.Tensor:
    """The Triton kernels (module docstring). Keywords for tests and benchmarks only: _guard=False
    puts the seed bug back (the unguarded empty-tile merge); _split (a multiple of 64) replaces
    SPLIT so that tests reach several splits with short caches, and a huge one is the single walk
    of old; _two_phase forces the split-K launch (True) or the one-program walk (False) and
    _tokens the tokens per program of the one-program walk — all give the same bits, None picks
    by shape; _block_t runs the portable products with that many tokens' rows in a block."""
    q, k_cache, v_cache, slots, positions, sinks = _check(q, k_cache, v_cache, slots, positions, sinks, window)
    if isinstance(_split, bool) or not isinstance(_split, int) or _split <= 0 or _split % BLOCK_KV:
        raise ValueError(f"attention: _split must be a positive multiple of {BLOCK_KV}, got {_split!r}")
    T, Hq, D = q.shape
    _, Hkv, S, _ = k_cache.shape
    G = Hq // Hkv
    out = torch.empty_like(q)
    if T == 0:
        return out
    same = q.dtype == k_cache.dtype == v_cache.dtype
    tc, g_p, block_t = row_block(G, q.dtype if same else torch.float32, _block_t)
    d_pad = max(16, next_pow2(D))
    tps = _split // BLOCK_KV
    n_cap = max(1, -(-S // _split))
    ng = split_grid(S, window, _split)
    walk = -(-S // BLOCK_KV) if window == 0 else min(_window_tiles(window), -(-S // BLOCK_KV))
    two_phase = (ng > 1 and walk > tps and T * Hkv < TWO_PHASE_BELOW) if _two_phase is None else bool(_two_phase)
    shape = dict(G=G, D_PAD=d_pad, BLOCK_KV=BLOCK_KV, TPS=tps, SLIDING=window > 0, GUARD=bool(_guard),
                 PORTABLE=PORTABLE_MATH, num_warps=4, num_stages=1, enable_fp_fusion=True)
    args = (Hq, Hkv, S, D, int(window), _window_tiles(window), n_cap)
    plus_zero = block_t > 1 or INTERPRET      # every zero +0: blocks must, the interpreter's launches all do
    if not two_phase:
        if INTERPRET and _block_t is None and ((_tokens or 0) > 1 or _blocks_pay(T, Hkv, INTERPRET_BLOCK_T)):
            block_t = INTERPRET_BLOCK_T       # its block per launch (else 1): a row's bits do not depend on it here
        tpp = _tokens or (block_t if _blocks_pay(T, Hkv, block_t) else 1)
        if tpp > block_t:
            raise ValueError(f"attention: _tokens={tpp} is more than the {block_t} tokens of a row block")
        _attention_kernel[(-(-T // tpp), Hkv)](q, k_cache, v_cache, slots, positions, sinks, out, T, tpp,
                                               *args, float(scale), G_P=g_p, BLOCK_T=block_t,
                                               USE_DOT=USE_DOT, TC=tc, PLUS_ZERO=plus_zero, **shape)
        return out
    m = torch.empty((T, Hkv, ng, G), dtype=torch.float32, device=q.device)   # split states
    l = torch.empty_like(m)
    acc = torch.empty((T, Hkv, ng, G, D), dtype=torch.float32, device=q.device)
    _attention_split_kernel[(T, Hkv, ng)](q, k_cache, v_cache, slots, positions, m, l, acc, T, *args, ng,
                                          float(scale), G_P=g_p, BLOCK_T=block_t, USE_DOT=USE_DOT, TC=tc,
                                          **shape)
    _attention_merge_kernel[(T, Hkv)](positions, sinks, m, l, acc, out, Hq, Hkv, D, int(window),
                                      _window_tiles(window), n_cap, ng, G_PAD=next_pow2(G),
                                      PLUS_ZERO=plus_zero, **shape)
    return out


# --------------------------------------------------------------------------- torch reference
# The bit-exact reference: the torch ops table's attention (engine/ops.py) and what the attention
# kernel specs compare attention_triton against (within their tolerance: the kernel's tiles are
# 64 keys and its merge is online). For query head h (KV head h // G) at position p:
#
#     s_j    = tree_sum_d(q_d * k_jd) * scale                      fixed tree over head_dim
#     m      = max(sink, max over visible j of s_j)                exact (0 where that is -inf)
#     p_j    = exp(s_j - m), 0 where not visible                   kernels.portable.exp
#     l      = e^(sink - m) + T_0 + T_1 + ...                      T_t = tree_sum over tile t
#     acc    = A_0 + A_1 + ...                                     A_t = tree_sum over tile t of p_j v_j
#     out    = acc / l                                             (0 for a row with l = 0)
#
# Keys are cut into fixed tiles of KV_TILE positions; within a tile the sum is the fixed tree,
# and the tiles are added first to last. Every operation is elementwise over (query, head), so
# a query's bits depend only on the query, its slot's cache and its position: not on its
# batchmates (D2), not on prefill, chunk or decode step (D3), nor on the machine (D0). A tile with
# no visible key (outside the window, or in the causal future; DESIGN §8 "empty tile") adds +0.0,
# which leaves the sums unchanged, so the result is also independent of the cache capacity. A row
# with no visible key and no finite sink (m = -inf, l = 0) comes out 0, as from the kernel; every
# other row has l >= 1 (its maximum's own e^0), so those two guards change none of its bits.

KV_TILE = 32   # key positions per tile of the torch reference; the cache capacity is a multiple of it


def attention_portable(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       slots: torch.Tensor, positions: torch.Tensor, sinks: torch.Tensor,
                       window: int, scale: float) -> torch.Tensor:
    """q [T, Hq, D]; k_cache, v_cache [slots, Hkv, S, D]; slots, positions [T] int64;
    sinks [Hq]; window 0 = full causal. -> [T, Hq, D] in q's dtype, computed in fp32."""
    T, Hq, D = q.shape
    S = k_cache.shape[2]
    if S % KV_TILE:
        raise ValueError(f"attention: cache capacity {S} is not a multiple of KV_TILE={KV_TILE}")
    if T == 0:
        return q.new_empty((0, Hq, D))
    out = q.new_empty((T, Hq, D))                                        # q's dtype
    rows = max(1, _CHUNK_ELEMENTS // (Hq * S * D))                       # memory bound only
    for t0 in range(0, T, rows):
        t1 = min(T, t0 + rows)
        out[t0:t1] = _attend(q[t0:t1], k_cache, v_cache, slots[t0:t1], positions[t0:t1],
                             sinks, window, scale)
    return out


_CHUNK_ELEMENTS = 1 << 23


def _attend(q, k_cache, v_cache, slots, positions, sinks, window, scale) -> torch.Tensor:
    """The recipe above for the queries q [T, Hq, D] -> [T, Hq, D]."""
    T, Hq, D = q.shape
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    keys = k_cache.index_select(0, slots).to(torch.float32)              # [T, Hkv, S, D]
    values = v_cache.index_select(0, slots).to(torch.float32)            # [T, Hkv, S, D]
    qg = q.to(torch.float32).reshape(T, Hkv, G, 1, D)                                       # head h = kv * G + g
    s = tree_sum(torch.mul(qg, keys[:, :, None]), -1)                     # [T, Hkv, G, S]
    s = torch.mul(s, scale)
    j = torch.arange(S, dtype=torch.int64, device=q.device)
    pos = positions[:, None]                                              # [T, 1]
    visible = j[None, :] <= pos                                           # [T, S]
    if window > 0:
        visible = visible & (j[None, :] > pos - window)
    visible = visible[:, None, None, :]                                   # [T, 1, 1, S]
    sink = sinks.to(torch.float32).reshape(1, Hkv, G, 1)
    s = torch.where(visible, s, float("-inf"))
    m = torch.maximum(s.amax(dim=-1, keepdim=True), sink)                 # [T, Hkv, G, 1]
    m = torch.where(m == float("-inf"), 0.0, m)                           # no key, no sink: all p = 0
    e = exp(torch.sub(torch.cat([s, sink.expand(T, Hkv, G, 1)], dim=-1), m))   # the keys', then the sink's
    p = torch.where(visible, e[..., :S], 0.0)                             # [T, Hkv, G, S]
    n_tiles = S // KV_TILE
    p_tiles = p.reshape(T, Hkv, G, n_tiles, KV_TILE)
    pv = torch.mul(p_tiles[..., None], values.reshape(T, Hkv, 1, n_tiles, KV_TILE, D))
    l_tiles = tree_sum(p_tiles, -1)                                       # [T, Hkv, G, n_tiles]
    acc_tiles = tree_sum(pv, -2)                                          # [T, Hkv, G, n_tiles, D]
    l = e[..., S]                                                         # [T, Hkv, G]: e^(sink - m)
    acc = acc_tiles[..., 0, :]
    for t in range(n_tiles):                                              # tiles first to last
        l = torch.add(l, l_tiles[..., t])
        if t > 0:
            acc = torch.add(acc, acc_tiles[..., t, :])
    l = torch.where(l == 0.0, 1.0, l)                                     # that row: acc = 0, out 0
    return torch.div(acc, l[..., None]).reshape(T, Hq, D).to(q.dtype)


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


# --------------------------------------------------------------------------- the kernel spec's case
def _attention_op(q, k, v, positions, sinks, window, scale):
    """The target operation: one sequence's keys and values [S, Hkv, D] (slot 0 of a cache)."""
    kc, vc = k.transpose(0, 1)[None].contiguous(), v.transpose(0, 1)[None].contiguous()
    slots = torch.zeros(q.shape[0], dtype=torch.int64, device=q.device)
    return attention_triton(q, kc, vc, slots, positions, sinks, window, scale)


def _attention_inputs(inp, s, d):
    """q [T, Hq, D], k and v [S, Hkv, D], positions [T] (the spec's, else drawn), sinks [Hq]."""
    Hq, Hkv, D, S = s["Hq"], s["Hkv"], s["D"], s["S"]
    pos = inp["positions"] if inp["positions"] is not None else torch.randint(0, S, (s["T"],), generator=d.g)
    kc, vc = d.normal(1, Hkv, S, D), d.normal(1, Hkv, S, D)
    q = d.normal(pos.shape[0], Hq, D, scale=inp["scale"])
    sinks = (torch.full((Hq,), inp["sink"]) if inp["sink"] is not None else portable.normal((Hq,), d.g)).to(d.device)
    return {"q": q, "k": kc[0].transpose(0, 1), "v": vc[0].transpose(0, 1), "positions": pos.to(d.device),
            "sinks": sinks, "window": s["window"], "scale": D ** -0.5}


def _attention_reference(x):
    q, kc, vc = x["q"], x["k"].transpose(0, 1)[None], x["v"].transpose(0, 1)[None]
    return attention_portable(q, kc, vc, torch.zeros(q.shape[0], dtype=torch.int64, device=q.device),
                              x["positions"], x["sinks"], x["window"], x["scale"])


def _attention_problems(inp, s):
    out = []
    if s["Hq"] % s["Hkv"]:
        out.append((("shape",), f"Hq = {s['Hq']} is not a multiple of Hkv = {s['Hkv']}"))
    if s["S"] % KV_TILE:
        out.append((("shape", "S"), f"S = {s['S']} is not a multiple of {KV_TILE} (the torch reference's tile; "
                                    f"a KV cache's capacity always is)"))
    return out


def _attention_elements(s):
    """The reference gathers every query's keys and values: 2 T Hkv S D."""
    T, Hq, Hkv, D, S = s["T"], s["Hq"], s["Hkv"], s["D"], s["S"]
    return 2 * T * Hq * D + 2 * Hkv * S * D + 2 * T * Hkv * S * D + 2 * T * Hq * S


CASES = (KernelCase(
    name="attention", dims=("Hq", "Hkv", "D", "S", "window"), optional_dims=("T",), inputs=_attention_inputs,
    op=_attention_op, interface=True, options=("positions", "sink"), expects=("prefill_decode",),
    call=lambda op, x, r, offered: op(x["q"][r], x["k"], x["v"], x["positions"][r], x["sinks"], x["window"],
                                      x["scale"]),
    reference=_attention_reference, elements=_attention_elements, problems=_attention_problems,
    note="lockstep.kernels.attention.attention_triton"),)
