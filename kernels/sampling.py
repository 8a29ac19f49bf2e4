"""Seeded Gumbel-max sampling over the vocabulary (DESIGN §5), fused with the coin hash.

    logp [R, V] float64 (temperature-scaled, masked with -inf, log-softmaxed: engine.sampling)
    seeds, positions [R] int64                         -> token ids [R] int64

    g_v   = -log(-clamp(log u_v, -DBL_MAX, -2^-32)),  u_v = murmur_hash32(seed, pos, SAMPLE_COLUMNS + v) / (2^32 - 1)
    token = argmax_v(logp_v + g_v), the lowest id on ties

One program per row walks the vocabulary in fixed BLOCK_V chunks, first to last, keeping the
best score and its id; a later chunk replaces it only if strictly greater, and inside a chunk
the lowest id among equal maxima wins. The hash is kernels.coins's; the log is float64:
kernels.portable's in the interpreter (so the noise equals the torch path's bit for bit), the
GPU's own when compiled (it may differ in the last bit, as DESIGN §5 allows).
"""

from __future__ import annotations

import torch
from lockstep.kernels import _common  # noqa: F401  (first: it sets TRITON_INTERPRET before triton is imported)
import triton
import triton.language as tl

from lockstep.kernels import portable
from lockstep.kernels._common import PORTABLE_MATH
from lockstep.kernels.case import KernelCase, rows_problems
from lockstep.kernels.coins import SAMPLE_COLUMNS, _fmix, _mix, gumbel_noise
from lockstep.kernels.portable_tl import _c, exp64, log64, log_f64

BLOCK_V = 1024
DBL_MAX = 1.7976931348623157e308


# The per-row seed and position pointers (one int64 load a row) are not aligned-specialized: a slice
# of them compiles nothing new, and their values reach only the integer hash.
@triton.jit(do_not_specialize=["seed_ptr", "pos_ptr"])
def _gumbel_argmax_kernel(logp_ptr, seed_ptr, pos_ptr, out_ptr, V, col_base,
                          BLOCK_V: tl.constexpr, PORTABLE: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    seed = tl.load(seed_ptr + r)
    pos = tl.load(pos_ptr + r)
    h0 = tl.zeros((BLOCK_V,), dtype=tl.uint32)
    h0 = _mix(h0, (seed & 0xFFFFFFFF).to(tl.uint32))
    h0 = _mix(h0, ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    h0 = _mix(h0, (pos & 0xFFFFFFFF).to(tl.uint32))
    best = tl.full((), float("-inf"), tl.float64)
    best_id = tl.full((), -1, tl.int64)
    for v0 in range(0, V, BLOCK_V):
        v = v0 + tl.arange(0, BLOCK_V).to(tl.int64)
        ok = v < V
        col = ((col_base + v) & 0xFFFFFFFF).to(tl.uint32)
        h = _fmix(_mix(h0, col))
        u = h.to(tl.float64) / 4294967295.0
        log_u = tl.minimum(tl.maximum(log_f64(u, PORTABLE), -1.7976931348623157e308), -2.3283064365386963e-10)
        g = -log_f64(-log_u, PORTABLE)
        lp = tl.load(logp_ptr + r * V + v, mask=ok, other=float("-inf")).to(tl.float64)
        score = tl.where(ok, lp + g, float("-inf"))
        m = tl.max(score, axis=0)
        idx = tl.min(tl.where(ok & (score == m), v, V + BLOCK_V), axis=0)
        take = (m > best) | (best_id < 0)
        best_id = tl.where(take, idx, best_id)
        best = tl.where(take, m, best)
    tl.store(out_ptr + r, best_id)


def gumbel_argmax_triton(logp: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
                         col_base: int = SAMPLE_COLUMNS) -> torch.Tensor:
    logp, seeds, positions = _check(logp, seeds, positions)
    out = torch.empty(logp.shape[0], dtype=torch.int64, device=logp.device)
    if logp.shape[0]:
        _gumbel_argmax_kernel[(logp.shape[0],)](logp, seeds, positions, out, logp.shape[1], int(col_base),
                                                BLOCK_V=BLOCK_V, PORTABLE=PORTABLE_MATH, num_warps=4,
                                                enable_fp_fusion=True)
    return out


def gumbel_argmax_torch(logp: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
                        col_base: int = SAMPLE_COLUMNS) -> torch.Tensor:
    """lockstep.engine.sampling.sample's seeded path after the masks: argmax(logp + gumbel_noise)."""
    logp, seeds, positions = _check(logp, seeds, positions)
    cols = col_base + torch.arange(logp.shape[1], dtype=torch.int64, device=logp.device)
    g = gumbel_noise(seeds, positions, cols)                         # [R, V] float64
    return torch.argmax(logp.to(torch.float64) + g, dim=-1)          # first maximum


def _check(logp, seeds, positions):
    if not isinstance(logp, torch.Tensor) or logp.dim() != 2 or not logp.dtype.is_floating_point:
        raise ValueError(f"gumbel_argmax: logp must be a 2-D float tensor, got {getattr(logp, 'shape', logp)}")
    for name, t in (("seeds", seeds), ("positions", positions)):
        if t.dtype != torch.int64 or t.shape != (logp.shape[0],):
            raise ValueError(f"gumbel_argmax: {name} must be int64 [{logp.shape[0]}], got {t.dtype} {tuple(t.shape)}")
    return logp.contiguous(), seeds.contiguous(), positions.contiguous()


# =========================================================================== the fused sampler
# engine.sampling's per-row path, every step the torch path's own IEEE operations in its own
# order, so the bits are the torch path's on every row:
#
#   z      = float64(x) / t   (CPU)   or   float64(x) * (1 / t)   (CUDA: torch multiplies by a
#            scalar divisor's reciprocal there, so the CUDA torch path does too)
#   z'     = z where keep (top-k / top-p / min-p mask, computed by the caller) else -inf
#   logp   = (z' - max z') - log64(tree_sum(exp64(z' - max z')))     portable.log_softmax
#   token  = argmax(logp + gumbel(hash(seed, pos, col_base + v)))     first maximum, NaN first
#   lp     = (x[token] - max x) - log(tree_sum(exp(x - max x)))      fp32 portable.log_softmax
#
# tree_sum is portable.tree_sum's order (fold the tail past P onto the head, then halve),
# which is a halving tree over the B-strided blocks followed by one over the B lanes: the
# blocks are visited in bit-reversed order and summed pairwise on a stack (_push), so the
# additions are exactly the tree's. The float64 math is kernels.portable_tl's polynomials
# (never the GPU's own exp/log) and the launches turn FMA contraction off.
#
# A row is split over C programs (chunks; C a power of two picked from the batch so that a
# launch fills the GPU: one program per row left a batch of one on one SM, ~1 ms a call). The
# bits do not depend on C: a max and a first-maximum argmax merge exactly in any grouping, and
# chunk c's share of the tree is the whole subtree over leaves [c Q / C, (c + 1) Q / C), whose
# root the top levels then add in the tree's order. Five launches, each one kernel below:
#   _maxima_kernel   [R, C]  the chunk's max of z' and of x; a GREEDY row's argmax of x
#   _sums_kernel     [R, C]  the row's maxima merged; the chunk's subtrees of both tree sums
#   _totals_kernel   [R]     the subtrees added by the top levels, the lanes halved: the sums
#   _draws_kernel    [R, C]  a SEEDED row's argmax of logp + gumbel over the chunk
#   _finish_kernel   [R]     the chunks' argmaxes merged in order: the token, its logprob

MAX_LEVELS = 8                      # the block stack: up to 2^8 blocks of FUSED_BLOCK ids
FUSED_BLOCK = 1024
GREEDY, SEEDED, FORCED = 0, 1, 2    # what a row does (the mode of the row)
MAX_CHUNKS = 64                     # programs per row, at most
FILL_PROGRAMS = 512                 # programs a launch aims at (rows x chunks), ~4 per SM of an H200


@triton.jit
def _level(s, c, go, t, k: tl.constexpr):
    bit = (t >> k) & 1
    s_new = tl.where(go & (bit == 0), c, s)
    c_new = tl.where(go & (bit == 1), s + c, c)
    return s_new, c_new, go & (bit == 1)


@triton.jit
def _push(s0, s1, s2, s3, s4, s5, s6, s7, leaf, t, L: tl.constexpr):
    """Leaf number t of a pairwise sum (binary counter): merges while t's low bits are 1."""
    c = leaf
    go = t >= 0
    if L > 0:
        s0, c, go = _level(s0, c, go, t, 0)
    if L > 1:
        s1, c, go = _level(s1, c, go, t, 1)
    if L > 2:
        s2, c, go = _level(s2, c, go, t, 2)
    if L > 3:
        s3, c, go = _level(s3, c, go, t, 3)
    if L > 4:
        s4, c, go = _level(s4, c, go, t, 4)
    if L > 5:
        s5, c, go = _level(s5, c, go, t, 5)
    if L > 6:
        s6, c, go = _level(s6, c, go, t, 6)
    if L > 7:
        s7, c, go = _level(s7, c, go, t, 7)
    return s0, s1, s2, s3, s4, s5, s6, s7, c


@triton.jit
def _halve(w, N: tl.constexpr):
    """w [N] -> [N / 2]: w[i] + w[i + N / 2] (one addition each)."""
    return tl.sum(tl.reshape(w, (2, N // 2)), axis=0)


@triton.jit
def _halve_all(w, B: tl.constexpr):
    """w [B] (B a power of two, at most 1024) -> the sum of its lanes: halved down to one lane, the
    widest halving first (1024 -> 512, ..., 2 -> 1; unrolled: only the sizes at most B)."""
    for e in tl.static_range(10, 0, -1):
        if B >= 2 ** e:
            w = _halve(w, 2 ** e)
    return tl.sum(w, axis=0)


@triton.jit
def _scaled(x_row, keep_row, has_keep, j, V, temp, RECIP: tl.constexpr):
    """z' at ids j (float64): temperature-scaled, -inf where the keep mask drops the id."""
    ok = j < V
    z = tl.load(x_row + j, mask=ok, other=0.0).to(tl.float64)
    if RECIP:
        z = z * temp
    else:
        z = z / temp
    keep = tl.load(keep_row + j, mask=ok, other=1)
    return tl.where(keep != 0, z, float("-inf"))


@triton.jit
def _leaf(x_row, keep_row, has_keep, j, V, m, temp, F64: tl.constexpr, RECIP: tl.constexpr):
    """One summand of a softmax denominator: exp64(z' - m) (F64) or fp32 exp(x - m)."""
    if F64:
        return exp64(_scaled(x_row, keep_row, has_keep, j, V, temp, RECIP) - m)
    else:
        x = tl.load(x_row + j, mask=j < V, other=0.0)
        return exp64((x - m).to(tl.float64)).to(tl.float32)


@triton.jit
def _tree_sum(x_row, keep_row, has_keep, V, m, temp, t0, F64: tl.constexpr, RECIP: tl.constexpr,
              P: tl.constexpr, B: tl.constexpr, QC: tl.constexpr, LC: tl.constexpr, L: tl.constexpr):
    """The subtree of portable.tree_sum over the row's leaf blocks t0 .. t0 + QC - 1 (QC = 2^LC,
    t0 a multiple of QC; L the whole tree's levels) -> its root [B], lanes not yet halved."""
    i = tl.arange(0, B).to(tl.int64)
    if F64:
        zero = tl.zeros((B,), dtype=tl.float64)
    else:
        zero = tl.zeros((B,), dtype=tl.float32)
    s0, s1, s2, s3, s4, s5, s6, s7, total = zero, zero, zero, zero, zero, zero, zero, zero, zero
    for t in range(QC):
        tt = t0 + t
        q = tt * 0
        for k in tl.static_range(L):
            q = q | (((tt >> k) & 1) << (L - 1 - k))         # block bitrev(tt): the tree's order
        j = q.to(tl.int64) * B + i
        a = _leaf(x_row, keep_row, has_keep, j, V, m, temp, F64, RECIP)
        b = _leaf(x_row, keep_row, has_keep, j + P, V, m, temp, F64, RECIP)
        leaf = tl.where(j + P < V, a + b, a)                     # the tail folded onto the head
        s0, s1, s2, s3, s4, s5, s6, s7, total = _push(s0, s1, s2, s3, s4, s5, s6, s7, leaf, t, LC)
    return total


@triton.jit
def _row_max(x_row, keep_row, has_keep, V, temp, lo, hi, F64: tl.constexpr, RECIP: tl.constexpr,
             B: tl.constexpr):
    """amax of ids lo .. hi - 1 of the row (z' when F64, else the raw fp32 logits), NaN if any
    entry is NaN (float64; -inf for an empty range)."""
    best = tl.full((), float("-inf"), tl.float64)
    nan = tl.full((), 0, tl.int32)
    for v0 in range(lo, hi, B):
        j = v0 + tl.arange(0, B).to(tl.int64)
        if F64:
            val = _scaled(x_row, keep_row, has_keep, j, V, temp, RECIP)
        else:
            val = tl.load(x_row + j, mask=j < V, other=float("-inf")).to(tl.float64)
        isn = val != val
        nan = tl.maximum(nan, tl.max(isn.to(tl.int32), axis=0))
        best = tl.maximum(best, tl.max(tl.where(isn, float("-inf"), val), axis=0))
    return tl.where(nan > 0, float("nan"), best)


@triton.jit
def _argmax_step(val, j, ok, best, best_id, nan_id, BIG):
    """One chunk of torch.argmax: the first maximum, or the first NaN if there is one."""
    isn = ok & (val != val)
    nan_id = tl.minimum(nan_id, tl.min(tl.where(isn, j, BIG), axis=0))
    clean = tl.where(ok & (val == val), val, float("-inf"))
    cm = tl.max(clean, axis=0)
    cid = tl.min(tl.where(ok & (val == val) & (clean == cm), j, BIG), axis=0)
    take = (cm > best) | (best_id == BIG)
    return tl.where(take, cm, best), tl.where(take, cid, best_id), nan_id


@triton.jit
def _gumbel(seed, pos, j, col_base, RECIP: tl.constexpr):
    """lockstep.kernels.coins.gumbel_from_hash at columns col_base + j, with the portable log."""
    h = tl.zeros(j.shape, dtype=tl.uint32)
    h = _mix(h, (seed & 0xFFFFFFFF).to(tl.uint32))
    h = _mix(h, ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32))
    h = _mix(h, (pos & 0xFFFFFFFF).to(tl.uint32))
    h = _fmix(_mix(h, ((col_base + j) & 0xFFFFFFFF).to(tl.uint32)))
    if RECIP:
        u = h.to(tl.float64) * _c(1.0 / 4294967295.0)
    else:
        u = h.to(tl.float64) / _c(4294967295.0)
    log_u = tl.minimum(tl.maximum(log64(u), -_c(1.7976931348623157e308)), -_c(2.3283064365386963e-10))
    return -log64(-log_u)


@triton.jit
def _chunk_ids(c, V, C: tl.constexpr, B: tl.constexpr):
    """The ids chunk c of C walks in the maxima and argmax passes: whole blocks of B, in order."""
    per = tl.cdiv(tl.cdiv(V, B), C) * B
    return c * per, tl.minimum(c * per + per, tl.cdiv(V, B) * B)


@triton.jit
def _merged_max(part_ptr, C: tl.constexpr):
    """The maxima of a row's C chunks merged: NaN if any is NaN, else the largest."""
    v = tl.load(part_ptr + tl.arange(0, C))
    isn = v != v
    return tl.where(tl.max(isn.to(tl.int32), axis=0) > 0, float("nan"), tl.max(tl.where(isn, float("-inf"), v), axis=0))


@triton.jit
def _maxima_kernel(x_ptr, keep_ptr, keep_idx_ptr, mode_ptr, temp_ptr, zmax_ptr, xmax_ptr,
                   best_ptr, id_ptr, nan_ptr, V, C: tl.constexpr, B: tl.constexpr, RECIP: tl.constexpr):
    """Chunk c of row r: the max of z' (SEEDED rows), of x, and a GREEDY row's argmax of x."""
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1).to(tl.int64)
    x_row = x_ptr + r * V
    keep_row = keep_ptr + tl.load(keep_idx_ptr + r) * V            # a row of ones if unfiltered
    mode = tl.load(mode_ptr + r)
    temp = tl.load(temp_ptr + r)
    lo, hi = _chunk_ids(c, V, C, B)
    if mode == 1:
        tl.store(zmax_ptr + r * C + c, _row_max(x_row, keep_row, 0, V, temp, lo, hi, True, RECIP, B))
    tl.store(xmax_ptr + r * C + c, _row_max(x_row, keep_row, 0, V, temp, lo, hi, False, RECIP, B))
    if mode == 0:                                                     # GREEDY: argmax of the raw logits
        BIG = V + B
        best, best_id, nan_id = tl.full((), float("-inf"), tl.float64), BIG.to(tl.int64), BIG.to(tl.int64)
        for v0 in range(lo, hi, B):
            j = v0 + tl.arange(0, B).to(tl.int64)
            val = tl.load(x_row + j, mask=j < V, other=0.0).to(tl.float64)
            best, best_id, nan_id = _argmax_step(val, j, j < V, best, best_id, nan_id, BIG)
        tl.store(best_ptr + r * C + c, best)
        tl.store(id_ptr + r * C + c, best_id)
        tl.store(nan_ptr + r * C + c, nan_id)


@triton.jit
def _sums_kernel(x_ptr, keep_ptr, keep_idx_ptr, mode_ptr, temp_ptr, zmax_ptr, xmax_ptr, s64_ptr, s32_ptr,
                 V, C: tl.constexpr, P: tl.constexpr, B: tl.constexpr, QC: tl.constexpr, LC: tl.constexpr,
                 L: tl.constexpr, RECIP: tl.constexpr):
    """Chunk c of row r: its subtrees of the float64 sum (SEEDED rows) and of the fp32 sum."""
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1).to(tl.int64)
    x_row = x_ptr + r * V
    keep_row = keep_ptr + tl.load(keep_idx_ptr + r) * V
    mode = tl.load(mode_ptr + r)
    temp = tl.load(temp_ptr + r)
    lanes = tl.arange(0, B)
    if mode == 1:
        m = _merged_max(zmax_ptr + r * C, C)
        part = _tree_sum(x_row, keep_row, 0, V, m, temp, c * QC, True, RECIP, P, B, QC, LC, L)
        tl.store(s64_ptr + (r * C + c) * B + lanes, part)
    m32 = _merged_max(xmax_ptr + r * C, C).to(tl.float32)
    part32 = _tree_sum(x_row, keep_row, 0, V, m32, temp, c * QC, False, RECIP, P, B, QC, LC, L)
    tl.store(s32_ptr + (r * C + c) * B + lanes, part32)


@triton.jit
def _top_of_tree(part_ptr, r, F64: tl.constexpr, C: tl.constexpr, LT: tl.constexpr, B: tl.constexpr):
    """Row r's C subtree roots [C, B] added by the tree's top LT levels, then the lanes halved."""
    lanes = tl.arange(0, B)
    if F64:
        zero = tl.zeros((B,), dtype=tl.float64)
    else:
        zero = tl.zeros((B,), dtype=tl.float32)
    s0, s1, s2, s3, s4, s5, s6, s7, total = zero, zero, zero, zero, zero, zero, zero, zero, zero
    for c in range(C):
        leaf = tl.load(part_ptr + (r * C + c) * B + lanes)
        s0, s1, s2, s3, s4, s5, s6, s7, total = _push(s0, s1, s2, s3, s4, s5, s6, s7, leaf, c, LT)
    return _halve_all(total, B)


@triton.jit
def _totals_kernel(mode_ptr, zmax_ptr, xmax_ptr, s64_ptr, s32_ptr, logs_ptr, m_ptr, m32_ptr, sum32_ptr,
                   C: tl.constexpr, LT: tl.constexpr, B: tl.constexpr):
    """Row r's maxima and sums: log of the float64 sum (SEEDED rows) and the fp32 sum."""
    r = tl.program_id(0).to(tl.int64)
    if tl.load(mode_ptr + r) == 1:
        tl.store(m_ptr + r, _merged_max(zmax_ptr + r * C, C))
        tl.store(logs_ptr + r, log64(_top_of_tree(s64_ptr, r, True, C, LT, B)))
    tl.store(m32_ptr + r, _merged_max(xmax_ptr + r * C, C).to(tl.float32))
    tl.store(sum32_ptr + r, _top_of_tree(s32_ptr, r, False, C, LT, B))


# seed_ptr, pos_ptr: as in _gumbel_argmax_kernel.
@triton.jit(do_not_specialize=["seed_ptr", "pos_ptr"])
def _draws_kernel(x_ptr, keep_ptr, keep_idx_ptr, mode_ptr, temp_ptr, seed_ptr, pos_ptr, m_ptr, logs_ptr,
                  best_ptr, id_ptr, nan_ptr, V, col_base, C: tl.constexpr, B: tl.constexpr, RECIP: tl.constexpr):
    """Chunk c of a SEEDED row r: the argmax of logp + gumbel over its ids."""
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1).to(tl.int64)
    if tl.load(mode_ptr + r) == 1:
        x_row = x_ptr + r * V
        keep_row = keep_ptr + tl.load(keep_idx_ptr + r) * V
        temp = tl.load(temp_ptr + r)
        seed = tl.load(seed_ptr + r)
        pos = tl.load(pos_ptr + r)
        m = tl.load(m_ptr + r)
        log_s = tl.load(logs_ptr + r)
        lo, hi = _chunk_ids(c, V, C, B)
        BIG = V + B
        best, best_id, nan_id = tl.full((), float("-inf"), tl.float64), BIG.to(tl.int64), BIG.to(tl.int64)
        for v0 in range(lo, hi, B):
            j = v0 + tl.arange(0, B).to(tl.int64)
            logp = (_scaled(x_row, keep_row, 0, j, V, temp, RECIP) - m) - log_s
            best, best_id, nan_id = _argmax_step(logp + _gumbel(seed, pos, j, col_base, RECIP), j, j < V,
                                                 best, best_id, nan_id, BIG)
        tl.store(best_ptr + r * C + c, best)
        tl.store(id_ptr + r * C + c, best_id)
        tl.store(nan_ptr + r * C + c, nan_id)


@triton.jit
def _finish_kernel(x_ptr, mode_ptr, best_ptr, id_ptr, nan_ptr, m32_ptr, sum32_ptr, tok_ptr, lp_ptr, V,
                   C: tl.constexpr, B: tl.constexpr):
    """Row r: the chunks' argmaxes merged in chunk order (the first maximum, else the first NaN;
    FORCED rows keep their token), then the token's fp32 logprob."""
    r = tl.program_id(0).to(tl.int64)
    token = tl.load(tok_ptr + r)
    if tl.load(mode_ptr + r) != 2:
        BIG = V + B
        best, best_id, nan_id = tl.full((), float("-inf"), tl.float64), BIG.to(tl.int64), BIG.to(tl.int64)
        for c in range(C):
            cm = tl.load(best_ptr + r * C + c)
            cid = tl.load(id_ptr + r * C + c)
            nan_id = tl.minimum(nan_id, tl.load(nan_ptr + r * C + c))
            take = (cid < BIG) & ((cm > best) | (best_id == BIG))
            best = tl.where(take, cm, best)
            best_id = tl.where(take, cid, best_id)
        token = tl.where(nan_id < BIG, nan_id, best_id)
    m32 = tl.load(m32_ptr + r)
    x_tok = tl.load(x_ptr + r * V + token)
    tl.store(tok_ptr + r, token)
    tl.store(lp_ptr + r, (x_tok - m32) - log64(tl.load(sum32_ptr + r).to(tl.float64)).to(tl.float32))


@triton.jit
def _distribution_kernel(x_ptr, keep_ptr, keep_idx_ptr, temp_ptr, out_ptr, V,
                         P: tl.constexpr, B: tl.constexpr, Q: tl.constexpr, L: tl.constexpr,
                         RECIP: tl.constexpr):
    """portable.softmax(z') of each row: exp64(z' - max) / tree_sum(...), float64 [R, V]."""
    r = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + r * V
    keep_row = keep_ptr + tl.load(keep_idx_ptr + r) * V            # a row of ones if unfiltered
    has_keep = 0
    temp = tl.load(temp_ptr + r)
    m = _row_max(x_row, keep_row, has_keep, V, temp, 0, V, True, RECIP, B)
    s = _halve_all(_tree_sum(x_row, keep_row, has_keep, V, m, temp, 0, True, RECIP, P, B, Q, L, L), B)
    for v0 in range(0, V, B):
        j = v0 + tl.arange(0, B).to(tl.int64)
        e = exp64(_scaled(x_row, keep_row, has_keep, j, V, temp, RECIP) - m)
        tl.store(out_ptr + r * V + j, e / s, mask=j < V)


def _tree_shape(V: int) -> dict:
    """The constexprs of _tree_sum for a vocabulary of V ids."""
    P = 1 << (V.bit_length() - 1)
    B = min(FUSED_BLOCK, P)
    Q = P // B
    L = Q.bit_length() - 1
    if L > MAX_LEVELS:
        raise ValueError(f"fused sampler: a vocabulary of {V} ids needs {L} stack levels (at most {MAX_LEVELS})")
    return dict(P=P, B=B, Q=Q, L=L)


def _row_inputs(logits, temps, keep, keep_idx):
    """The kernels' operands; keep gains a last row of ones, where keep_idx -1 points."""
    R, V = logits.shape
    ones = torch.ones((1, V), dtype=torch.uint8, device=logits.device)
    if keep is None:
        keep, keep_idx = ones, torch.zeros(R, dtype=torch.int64, device=logits.device)
    else:
        keep_idx = torch.where(keep_idx < 0, keep.shape[0], keep_idx)
        keep = torch.cat([keep.to(torch.uint8), ones])
    return logits.contiguous(), temps.to(torch.float64).contiguous(), keep.contiguous(), keep_idx.contiguous()


def fused_temperature(t: float, device) -> float:
    """What the kernel is given for temperature t on `device`: t itself (it divides, as torch does
    on the CPU) or 1 / t (it multiplies, as torch does on CUDA for a scalar divisor)."""
    return 1.0 / t if torch.device(device).type == "cuda" else t


def chunks_per_row(R: int, Q: int) -> int:
    """C, the programs a row is split over: enough for R rows to fill the GPU (FILL_PROGRAMS),
    at most MAX_CHUNKS and the row's Q leaf blocks; a power of two. Speed only: not the bits."""
    want = max(1, -(-FILL_PROGRAMS // max(R, 1)))
    return min(1 << (want - 1).bit_length(), MAX_CHUNKS, Q)


def sample_fused_triton(logits: torch.Tensor, modes: torch.Tensor, temps: torch.Tensor, seeds: torch.Tensor,
                        positions: torch.Tensor, tokens: torch.Tensor, keep: torch.Tensor | None = None,
                        keep_idx: torch.Tensor | None = None, col_base: int = SAMPLE_COLUMNS,
                        chunks: int | None = None):
    """Every row of logits [R, V] fp32 sampled by its mode (GREEDY, SEEDED, FORCED: tokens[r] is
    kept) -> (tokens [R] int64, chosen logprobs [R] fp32). temps [R] float64 from
    fused_temperature; keep [K, V] bool and keep_idx [R] (-1: no mask) the rows' filter masks.
    chunks: programs per row (default chunks_per_row; tests vary it: the bits must not move)."""
    R, V = logits.shape
    x, temps, keep, keep_idx = _row_inputs(logits, temps, keep, keep_idx)
    tok = tokens.to(torch.int64).clone()
    lp = torch.empty(R, dtype=torch.float32, device=logits.device)
    if not R:
        return tok, lp
    tree = _tree_shape(V)
    P, B, Q, L = tree["P"], tree["B"], tree["Q"], tree["L"]
    C = chunks_per_row(R, Q) if chunks is None else chunks
    if isinstance(C, bool) or not isinstance(C, int) or C & (C - 1) or not 1 <= C <= Q:
        raise ValueError(f"sample_fused_triton: chunks must be a power of two in 1 .. {Q}, got {C}")
    LT = C.bit_length() - 1
    dev = logits.device
    f64 = lambda *shape: torch.empty(shape, dtype=torch.float64, device=dev)       # noqa: E731
    i64 = lambda *shape: torch.empty(shape, dtype=torch.int64, device=dev)         # noqa: E731
    zmax, xmax, best, ids, nans = f64(R, C), f64(R, C), f64(R, C), i64(R, C), i64(R, C)
    s64, s32 = f64(R, C, B), torch.empty((R, C, B), dtype=torch.float32, device=dev)
    logs, m, m32, sum32 = f64(R), f64(R), torch.empty(R, dtype=torch.float32, device=dev), \
        torch.empty(R, dtype=torch.float32, device=dev)
    modes, seeds, positions = modes.to(torch.int32).contiguous(), seeds.contiguous(), positions.contiguous()
    recip = dev.type == "cuda"
    opts = dict(num_warps=8, enable_fp_fusion=False)
    _maxima_kernel[(R, C)](x, keep, keep_idx, modes, temps, zmax, xmax, best, ids, nans, V, C=C, B=B,
                           RECIP=recip, **opts)
    _sums_kernel[(R, C)](x, keep, keep_idx, modes, temps, zmax, xmax, s64, s32, V, C=C, P=P, B=B, QC=Q // C,
                         LC=L - LT, L=L, RECIP=recip, **opts)
    _totals_kernel[(R,)](modes, zmax, xmax, s64, s32, logs, m, m32, sum32, C=C, LT=LT, B=B, **opts)
    _draws_kernel[(R, C)](x, keep, keep_idx, modes, temps, seeds, positions, m, logs, best, ids, nans, V,
                          int(col_base), C=C, B=B, RECIP=recip, **opts)
    _finish_kernel[(R,)](x, modes, best, ids, nans, m32, sum32, tok, lp, V, C=C, B=B, **opts)
    return tok, lp


def distributions_triton(logits: torch.Tensor, temps: torch.Tensor, keep: torch.Tensor | None = None,
                         keep_idx: torch.Tensor | None = None) -> torch.Tensor:
    """portable.softmax(z') of every row (the target distributions of speculative verification):
    logits [R, V] fp32 -> [R, V] float64; temps, keep, keep_idx as in sample_fused_triton."""
    R, V = logits.shape
    x, temps, keep, keep_idx = _row_inputs(logits, temps, keep, keep_idx)
    out = torch.empty((R, V), dtype=torch.float64, device=logits.device)
    if R:
        _distribution_kernel[(R,)](x, keep, keep_idx, temps, out, V, **_tree_shape(V),
                                   RECIP=logits.device.type == "cuda", num_warps=8, enable_fp_fusion=False)
    return out


# --------------------------------------------------------------------------- the kernel spec's case
def _sampling_op(logp, seeds, positions, col_base=None):
    return gumbel_argmax_triton(logp, seeds, positions, SAMPLE_COLUMNS if col_base is None else col_base)


def _sampling_inputs(inp, s, d):
    z = d.normal(s["R"], s["V"], scale=2 * inp["scale"], dtype=torch.float64)
    seeds = torch.randint(-(1 << 62), 1 << 62, (s["R"],), generator=d.g).to(d.device)
    pos = torch.randint(0, 1 << 20, (s["R"],), generator=d.g).to(d.device)
    if inp.get("rows") is not None:                               # written keys (and logits)
        seeds = torch.tensor([row["seed"] for row in inp["rows"]], dtype=torch.int64, device=d.device)
        pos = torch.tensor([row["position"] for row in inp["rows"]], dtype=torch.int64, device=d.device)
        for i, row in enumerate(inp["rows"]):
            if row["logits"] is not None:
                z[i] = float("-inf")
                for v, x in row["logits"].items():
                    z[i, int(v)] = float(x)
    base = SAMPLE_COLUMNS if inp.get("col_base") is None else inp["col_base"]
    return {"logp": portable.log_softmax(z, -1), "seeds": seeds, "positions": pos, "col_base": base}


def _sampling_call(op, x, r, offered):
    kw = {"col_base": x["col_base"]} if "col_base" in offered else {}
    return op(x["logp"][r], x["seeds"][r], x["positions"][r], **kw)


CASES = (KernelCase(
    name="sampling", dims=("R", "V"), inputs=_sampling_inputs, op=_sampling_op, call=_sampling_call,
    reference=lambda x: gumbel_argmax_torch(x["logp"], x["seeds"], x["positions"], x["col_base"]),
    elements=lambda s: 3 * s["R"] * s["V"], options=("rows", "col_base"), features=("col_base",),
    problems=rows_problems, interface=True, note="lockstep.kernels.sampling.gumbel_argmax_triton"),)
