"""Batch-invariant linear layer: y = x @ W^T + b (DESIGN §2 D2/D3, §8 unguarded tails).

    x [M, K]  (fp32 or bf16)      W [N, K] (same dtype)      b [N] or None      -> y [M, N]

Every output element y[m, n] is accumulated in fp32 over K, first to last, with no split-K: in
the interpreter in fixed BLOCK_K chunks (one tile set, TILES), compiled as `tl.dot`'s sequence of
FMA or MMA steps, whose bits no tile choice changes (so the GPU tiles follow the rows: `tiles`).
So the bits of a row depend only on that row, W, b and K: not on M, on the row's index inside
its tile, or on N. Tails in M, N and K are masked loads with zero fill (a masked
lane contributes an exact +0), so N = 2880 / 2881 with BLOCK_N = 64 need no special case.

On the interpreter the tile product is an explicit broadcast multiply + tl.sum over BLOCK_K
(tl.dot is a numpy matmul there and is not row invariant; see kernels/_common.py). On a GPU
it is tl.dot with input_precision="ieee".

The torch reference is linear_portable below: kernels.portable's fixed-tree matmul, the same bits
on every machine and batch (the torch ops table runs it; the kernel specs compare against it
within their tolerance: the kernel's K order is its own). linear_chunks_portable likewise for
the K-chunk partials of row-parallel layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lockstep.kernels import _common  # noqa: F401  (first: it sets TRITON_INTERPRET before triton is imported)
import triton
import triton.language as tl

from lockstep.kernels._common import INTERPRET, PORTABLE_MATH, USE_DOT, check_float
from lockstep.kernels.case import KernelCase
from lockstep.kernels.portable import matmul_nt
from lockstep.kernels.portable_tl import cast_rne, sigmoid_f32

# The interpreter's tiles: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages), one set for every call
# (compiled launches take `_gpu_tiles`).
TILES = (16, 128, 128, 4, 1)

# GPU tile table. No output bit depends on the tile, so the tile may follow the launch's rows M:
#   fp32: `tl.dot` with input_precision="ieee" is an FMA chain over k, first to last, for each
#     output element, whatever BLOCK_M, BLOCK_N and BLOCK_K are (a masked tail adds fma(0, w, acc)).
#   bf16 / fp16: each element is the sequence of 16-wide MMA steps over k, first to last, into one
#     fp32 accumulator; mma.sync (BLOCK_M 16, 32) and wgmma (64, 128) give the same bits, and so
#     does every BLOCK_N, BLOCK_K and stage count: an H200 sweep of 44 tiles at the 20b shapes (qkv,
#     o_proj's chunks, the router, the LM head; M = 1 and 32) found one set of bits
#     (docs/history/benchmarks.md), and tests/kernels/test_matmul.py compares a row alone with the same
#     row in batches that take each tile below.
# So a row's bits are the same whatever the batch (D2) while each batch takes its fastest tile:
#   M <= DECODE_ROWS (a decode step): 16 rows, 256 columns of K a step (fewer, longer loads: the
#     step is bound by reading the weight once);
#   M >= PREFILL_ROWS: 128 x 128 tiles on 8 warps (tensor-core bound);
#   otherwise, and fp32 always, 64 rows; BLOCK_N 64, or 32 below GPU_MIN_PROGRAMS programs per M
#     tile (a 2880-wide layer gives 45 programs of 64 on a 132-SM H200; tl.dot needs >= 16), a
#     program per K chunk counted (o_proj's 8 chunks: 360 programs of 64, 0.55x the time of 32's
#     at 32 rows on an H200, docs/history/benchmarks.md).
GPU_MIN_PROGRAMS = 128
DECODE_ROWS = 16
PREFILL_ROWS = 256


def _gpu_tiles(N: int, K: int, dtype: torch.dtype, M: int, chunks: int = 1) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) for M rows by a weight [N, K] of `dtype`
    on a GPU, in `chunks` K chunks (a program each)."""
    if dtype != torch.float32 and M <= DECODE_ROWS:
        return (16, 32 if N <= 32 else 64, 256, 4, 3)
    if dtype != torch.float32 and M >= PREFILL_ROWS:
        return (128, 128, 64, 8, 3)
    bn = 64 if triton.cdiv(N, 64) * chunks >= GPU_MIN_PROGRAMS else 32
    return (64, bn, 64, 4, 3)


def tiles(N: int, K: int, dtype: torch.dtype, M: int, chunks: int = 1) -> tuple[int, int, int, int, int]:
    """The tiles of a linear kernel launch here: TILES in the interpreter, the GPU table compiled."""
    return TILES if INTERPRET else _gpu_tiles(N, K, dtype, M, chunks)


@triton.jit
def _output_tile(pid_n, pid_m, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Program (pid_n, pid_m)'s output tile: rows rm [BM] and columns rn [BN] (int64) with their
    in-range masks."""
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)      # [BM]
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)      # [BN]
    return rm, rn, rm < M, rn < N


# M (the rows of a launch) is not specialized, one compile for every batch: it only masks rows and
# indexes them, and a row's bits never depended on M (module docstring). N and K (the weight's) are.
@triton.jit(do_not_specialize=["M"])
def _linear_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K,
                   HAS_BIAS: tl.constexpr, USE_DOT: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # program (pid_n, pid_m) computes y[rm, rn]: a [BLOCK_M, BLOCK_N] tile; x, W, y row-major.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm, rn, m_ok, n_ok = _output_tile(pid_n, pid_m, M, N, BLOCK_M, BLOCK_N)
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
    tl.store(y_ptr + rm[:, None] * N + rn[None, :], cast_rne(acc, y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


# ---------------------------------------------------------------- K-chunked partial products
# A row-parallel layer (o_proj, the experts' down) reduces over K in fixed chunks [lo, hi) and
# adds the chunk partials in a fixed tree (engine/linear.py). One launch computes every chunk:
#
#     parts[c, m, n] = sum over j in [0, hi_c - lo_c) of a[m, lo_c + j] * W[n, lo_c + j]
#
# reduced exactly as `_linear_kernel` reduces a fresh [M, hi_c - lo_c] copy of the chunk: acc = 0,
# then BLOCK_K steps at chunk-relative offsets j0 = 0, BLOCK_K, ... (lanes past the chunk's end are
# masked to +0), the same tile expression on the interpreter and the same ieee tl.dot compiled. So
# each element has the bits of the per-chunk linear, and, as there, they depend only on its own
# row, W and the chunk bounds: not on M, the row's place in its tile, N or the number of chunks.
#
# The device helpers below are shared with the grouped expert kernels (kernels/moe.py).

@triton.jit
def _swiglu_tile(gate, up, alpha, limit, PORTABLE: tl.constexpr):
    """lockstep.kernels.moe._swiglu_kernel's math on fp32 tiles, operation for operation."""
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    return gate * sigmoid_f32(alpha * gate, PORTABLE) * (up + 1.0)


@triton.jit
def _load_a_tile(a_ptr, rows, r_ok, A_STRIDE, col, k_ok, alpha, limit,
                 SWIGLU: tl.constexpr, PORTABLE: tl.constexpr):
    """Rows `rows` [BM], K columns `col` [BK] of the activations -> [BM, BK] in a's dtype, 0 where
    masked. SWIGLU: a holds interleaved gate/up pairs (gate = column 2k, up = 2k + 1) and the tile is
    the clamped SwiGLU of them, rounded to a's dtype as the separate kernel's store rounds it."""
    mask = r_ok[:, None] & k_ok[None, :]
    if SWIGLU:
        base = a_ptr + rows[:, None] * A_STRIDE + 2 * col[None, :]
        gate = tl.load(base, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(base + 1, mask=mask, other=0.0).to(tl.float32)
        y = _swiglu_tile(gate, up, alpha, limit, PORTABLE)
        a = cast_rne(tl.where(mask, y, 0.0), a_ptr.dtype.element_ty)
    else:
        a = tl.load(a_ptr + rows[:, None] * A_STRIDE + col[None, :], mask=mask, other=0.0)
    return a


@triton.jit
def _mxfp4_values(code, scale):
    """E2M1 codes (int32, 0..15) and E8M0 scales (int32, 0..255) -> fp32 code * 2^(scale - 127),
    exact (engine/mxfp4.py `dequantize`); scale 255 -> NaN. Built from bits alone, no float
    multiply (a compiled kernel may flush the subnormal results of scale 0 or 1 to zero): a code
    is sign (bit 3), a 2-bit exponent e and a mantissa bit m, |value| = 2^E (1 + f/2) with
    E = e - 1, f = m for e >= 1, and 0.5 = 2^-1 for e = 0, m = 1; the result's biased exponent
    is E + scale, below 1 a subnormal (the significand shifted right), from 255 on infinity."""
    e = (code >> 1) & 3
    m = code & 1
    E = tl.where(e == 0, -1, e - 1)
    f = tl.where(e == 0, 0, m)
    b = E + scale                                                          # biased exponent
    normal = (b << 23) | (f << 22)
    subnormal = ((1 << 23) | (f << 22)) >> tl.maximum(1 - b, 0)
    mag = tl.where(b >= 255, 0x7F800000, tl.where(b >= 1, normal, subnormal))
    mag = tl.where((e == 0) & (m == 0), 0, mag)
    value = (mag | ((code >> 3) << 31)).to(tl.float32, bitcast=True)     # -0.0 for code 8
    return tl.where(scale == 255, float("nan"), value)


# The MXFP4 fast path. With every scale s of a tile in [2, 252] no value is subnormal, infinite or
# NaN: a nonzero code with magnitude index t = code & 7 is 2^E (1 + f/2) * 2^(s - 127), a normal
# number whose exponent field is s + E and whose top mantissa bit is f. Written with the mantissa
# bit at M (bf16: 6, fp32: 22), for t >= 2 (E = (t >> 1) - 1, f = t & 1) its magnitude bits are
# (t << M) + ((s - 1) << (M + 1)); t = 1 (0.5) is (s - 1) << (M + 1); t = 0 is 0. Exactly
# `_mxfp4_values`'s answer there (tests/kernels/test_mxfp4_tile.py: every code at every scale of the
# range), in about 12 instructions a value instead of about 40 (sm_90 SASS of the 20b gate_up K step,
# docs/history/benchmarks.md). Outside the range (subnormal results, infinities, NaN blocks) the kernels keep
# `_mxfp4_values`. `_mxfp4_fast_ok` spells the range out (a jit function reads no Python tuple).
MXFP4_FAST_SCALES = (2, 252)


@triton.jit
def _mxfp4_fast_ok(s_ptr, row, n_ok, K, lo, width, BLOCK_N: tl.constexpr):
    """True when columns [lo, lo + width) of rows `row` [BN] (flat expert * N + n) may take the fast
    decode: lo and width even, every scale group they touch in MXFP4_FAST_SCALES. One pass over the
    scales, once per program (1/16 of the bytes the tiles read); masked rows do not count."""
    G = K // 32
    g_lo = lo // 32
    g_hi = (lo + width + 31) // 32                                                   # past the last group
    GW: tl.constexpr = 32
    bad = tl.zeros((BLOCK_N, GW), dtype=tl.int32)
    for g0 in range(g_lo, g_hi, GW):
        g = g0 + tl.arange(0, GW)                                                    # [GW]
        s = tl.load(s_ptr + row[:, None] * G + g[None, :], mask=n_ok[:, None] & (g < g_hi)[None, :],
                    other=127).to(tl.int32)                                          # [BN, GW]
        bad |= ((s < 2) | (s > 252)).to(tl.int32)                                   # MXFP4_FAST_SCALES
    return (tl.max(tl.max(bad, axis=1), axis=0) == 0) & (lo % 2 == 0) & (width % 2 == 0)


@triton.jit
def _mxfp4_fast_values(code, S, M: tl.constexpr):
    """E2M1 codes (int32, 0..15) and S = (scale - 1) << (M + 1) for scales in [2, 252] -> the bits
    (int32) of code * 2^(scale - 127) with the mantissa's top bit at M (bf16: 6, fp32: 22)."""
    t = code & 7
    mag = tl.where(t >= 2, (t << M) + S, tl.where(t == 1, S, 0))
    return mag | ((code & 8) << (M + 6))                                             # sign: bit 15 / 31


# Compiled, bf16 tiles of the fast path decode in PTX: the E2M1 value of each code's magnitude
# index t comes from two 8-entry byte tables (its bf16's high and low byte) looked up four at a time
# by `prmt`, the signs moved into place by another `prmt`, and the scale by one bf16x2 multiply by 2^(s - 127). The
# product is exact and normal for scales in [2, 252] (|value| from 0.5 * 2^-125 = 2^-126 to
# 6 * 2^125), so these are `_mxfp4_fast_values`' bits (tests/kernels/test_mxfp4_tile.py, every code
# at every scale, compiled) in about 3 instructions a value instead of about 12. The interpreter
# cannot run PTX and keeps the integer formula.
PTX_E2M1 = tl.constexpr(not INTERPRET)


@triton.jit
def _e2m1_ptx(byte, power):
    """bytes (uint8: codes of columns 2b (low nibble) and 2b + 1) and power (bf16 2^(s - 127), s in
    [2, 252]) -> (lo, hi) bf16: the values of the two columns. Four bytes an invocation: $4 holds
    them (byte i in bits 8i..8i + 7), $5 and $6 their powers in pairs; $0 and $1 the four low-nibble
    values in pairs, $2 and $3 the high-nibble ones."""
    return tl.inline_asm_elementwise(
        asm="""
        {
        .reg .b32 t, t2, h0, h1, l0, l1, x0, x1, y, a, b;
        and.b32 t, $4, 0x77777777;                 // magnitude indices, sign bits cleared
        shr.u32 t2, t, 16;
        prmt.b32 h0, 0x3F3F3F00, 0x40404040, t;    // high bytes of the bf16 E2M1 values, nibbles 0-3
        prmt.b32 l0, 0xC0800000, 0xC0804000, t;    // low bytes
        prmt.b32 h1, 0x3F3F3F00, 0x40404040, t2;   // nibbles 4-7
        prmt.b32 l1, 0xC0800000, 0xC0804000, t2;
        prmt.b32 x0, $4, 0, 0x1404;                // bytes 0, 1 moved up to bytes 1, 3: the high nibbles'
        prmt.b32 x1, $4, 0, 0x3424;                // sign bits land on 15 and 31, the low ones' 4 below
        prmt.b32 a, l0, h0, 0x6240;                // bytes 0, 1: the low nibbles' values in a bf16 pair
        prmt.b32 b, l0, h0, 0x7351;                // the high nibbles'
        shl.b32 y, x0, 4;
        lop3.b32 a, a, y, 0x80008000, 0xF8;        // a | (y & 0x80008000): the signs
        lop3.b32 b, b, x0, 0x80008000, 0xF8;
        mul.rn.bf16x2 $0, a, $5;
        mul.rn.bf16x2 $2, b, $5;
        prmt.b32 a, l1, h1, 0x6240;                // bytes 2, 3
        prmt.b32 b, l1, h1, 0x7351;
        shl.b32 y, x1, 4;
        lop3.b32 a, a, y, 0x80008000, 0xF8;
        lop3.b32 b, b, x1, 0x80008000, 0xF8;
        mul.rn.bf16x2 $1, a, $6;
        mul.rn.bf16x2 $3, b, $6;
        }
        """,
        constraints="=r,=r,=r,=r,r,r,r",
        args=[byte, power], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


@triton.jit
def _mxfp4_tile_fast(w_ptr, s_ptr, row, n_ok, k0, k_end, K, OUT_DTYPE: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ALIGNED: tl.constexpr, WHOLE: tl.constexpr):
    """`_load_w_tile`'s MXFP4 tile on the fast path: k0 and k_end even, so byte b of a row holds
    columns 2b (low nibble) and 2b + 1 (high), both in scale group b // 16. The tile's BK/2 bytes
    are BK/32 pieces of 16 (one vector load each when the row's bytes allow it); piece p starts at
    byte kb + 16 p (kb = k0 / 2) in group kb // 16 + p, and its bytes from 16 - kb % 16 on are in the
    next group (none when ALIGNED, the caller's promise that k0 % 32 == 0). Bytes past k_end and of
    masked rows count as 0 (two +0 codes); WHOLE: the caller's promise that there are none past k_end."""
    G = K // 32
    M: tl.constexpr = 6 if OUT_DTYPE == tl.bfloat16 else 22
    NP: tl.constexpr = BLOCK_K // 32
    row_bytes = tl.multiple_of(K // 2, 16)                                           # K = 32 G
    kb = k0 // 2
    p = tl.arange(0, NP)[None, :, None]                                              # [1, NP, 1]
    i = tl.arange(0, 16)[None, None, :]                                              # [1, 1, 16]
    byte = kb + 16 * p + i                                                           # [1, NP, 16] in the row
    # whole 16-byte pieces of the row (masked only past the row's end, so vector loads), then,
    # unless the tile is WHOLE (all before k_end), the bytes from k_end on zeroed
    x = tl.load(w_ptr + (row * row_bytes)[:, None, None] + byte,
                mask=n_ok[:, None, None] & (byte < row_bytes), other=0)                # [BN, NP, 16] u8
    if not WHOLE:
        x = tl.where(2 * byte < k_end, x, 0)
    s_row = s_ptr + row[:, None] * G                                                 # [BN, 1]
    g = kb // 16 + tl.arange(0, NP)[None, :]                                         # [1, NP] group of each piece
    s = tl.load(s_row + tl.minimum(g, G - 1), mask=n_ok[:, None], other=127).to(tl.int32)   # [BN, NP]
    S = ((s - 1) << (M + 1))[:, :, None]                                             # [BN, NP, 1]
    if not ALIGNED:
        s_next = tl.load(s_row + tl.minimum(g + 1, G - 1), mask=n_ok[:, None], other=127).to(tl.int32)
        S = tl.where(kb % 16 + i >= 16, ((s_next - 1) << (M + 1))[:, :, None], S)   # [BN, NP, 16]
    if OUT_DTYPE == tl.bfloat16 and PTX_E2M1:
        # compiled bf16: the same values from byte tables and one exact multiply (_e2m1_ptx)
        power = S + (1 << (M + 1))                                                   # s << 7: bf16 2^(s - 127)
        if not WHOLE:
            # bytes past k_end are +0 codes, but a scale group wholly past it may be 255 (an inf
            # power: 0 x inf = NaN), which no fast check looked at: multiply those by 2^0
            power = tl.where(2 * byte < k_end, power, 127 << (M + 1))
        power = power.to(tl.int16).to(tl.bfloat16, bitcast=True)
        lo, hi = _e2m1_ptx(x, tl.broadcast_to(power, x.shape))
        return tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))                       # [BN, BK] interleaved
    x = x.to(tl.int32)
    lo = _mxfp4_fast_values(x & 15, S, M)                                            # column 2 byte
    hi = _mxfp4_fast_values(x >> 4, S, M)                                            # column 2 byte + 1
    if OUT_DTYPE == tl.bfloat16:
        lo = lo.to(tl.int16).to(tl.bfloat16, bitcast=True)
        hi = hi.to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        lo = lo.to(tl.float32, bitcast=True)
        hi = hi.to(tl.float32, bitcast=True)
    return tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))                           # [BN, BK] interleaved


@triton.jit
def _load_w_tile(w_ptr, s_ptr, expert, rn, n_ok, k0, k_end, N, K, MXFP4: tl.constexpr,
                 OUT_DTYPE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FAST: tl.constexpr = False,
                 ALIGNED: tl.constexpr = False, WHOLE: tl.constexpr = False):
    """Rows `rn` [BN], columns k0 .. k0 + BLOCK_K - 1 of weight `expert` -> [BN, BK] in OUT_DTYPE,
    0 where the row is masked or the column is >= k_end (<= K). Dense: w [E, N, K] in OUT_DTYPE.

    MXFP4: blocks w [E, N, K/32, 16] u8, scales s [E, N, K/32] u8, so a row's K/2 bytes lie in a
    row: column k is nibble k % 2 (low = even) of row byte k // 2, with scale k // 32. The tile's
    BK/2 bytes are loaded once, [BN, BK/2], and their two nibbles interleaved into [BN, BK] codes;
    each of the BK/32 + 1 scale groups from k0's on is loaded once, [BN] (the last one is used
    only when k0 % 32 != 0); `_mxfp4_values` decodes them, bit-exact, no float multiply; cast to
    fp32 or bf16 (exact: every MXFP4 value fits both, subnormals included). Same bits as a
    per-element decode (tests/kernels/test_mxfp4_tile.py). k0 may be any column: a down chunk
    starts where engine.linear.k_chunk_bounds puts it (360 in I = 2880: mid-group), and bounds
    may be odd. For an odd k0 a column pair straddles two bytes: column k0 + 2i is the high
    nibble of byte i of the tile and k0 + 2i + 1 the low nibble of byte i + 1.

    FAST (the caller's promise, `_mxfp4_fast_ok`: k0 and k_end even, every scale the tile's real
    columns use in [2, 252]): `_mxfp4_tile_fast`, the same values from a few integer operations
    (ALIGNED: also k0 % 32 == 0; WHOLE: also k0 + BLOCK_K <= k_end)."""
    col = k0 + tl.arange(0, BLOCK_K)                                                  # [BK]
    mask = n_ok[:, None] & (col < k_end)[None, :]                                     # [BN, BK]
    if MXFP4 and FAST:
        w = _mxfp4_tile_fast(w_ptr, s_ptr, expert * N + rn, n_ok, k0, k_end, K, OUT_DTYPE, BLOCK_N, BLOCK_K,
                             ALIGNED, WHOLE)
    elif MXFP4:
        G = K // 32
        row = expert * N + rn                                                         # [BN] int64
        c = k0 + 2 * tl.arange(0, BLOCK_K // 2)                                      # [BK/2] even elements' columns
        odd = (c % 2).to(tl.int32)[None, :]                                           # [1, BK/2], all k0 % 2
        b_ptr = (w_ptr + row * (K // 2))[:, None] + (c // 2)[None, :]                 # [BN, BK/2] byte of column c
        b0 = tl.load(b_ptr, mask=n_ok[:, None] & (c < k_end)[None, :], other=0).to(tl.int32)
        b1 = tl.load(b_ptr + 1, mask=n_ok[:, None] & ((c + 1 < k_end) & (c % 2 == 1))[None, :],
                     other=0).to(tl.int32)                                            # next byte, odd k0 only
        code_even = (b0 >> (4 * odd)) & 0xF                                           # column c
        code_odd = tl.where(odd == 1, b1, b0 >> 4) & 0xF                              # column c + 1
        code = tl.reshape(tl.join(code_even, code_odd), (BLOCK_N, BLOCK_K))           # [BN, BK] interleaved
        # The tile touches groups g0 .. g0 + BK/32 (the last only when k0 % 32 != 0; past the row's
        # end it is clamped to a real group, whose columns here are all masked).
        g0 = k0 // 32
        group = col // 32 - g0                                                        # [BK] in [0, BK/32]
        scale = tl.full((BLOCK_N, BLOCK_K), 127, tl.int32)
        for j in tl.static_range(BLOCK_K // 32 + 1):
            s = tl.load(s_ptr + row * G + tl.minimum(g0 + j, G - 1), mask=n_ok, other=127)   # [BN]
            scale = tl.where((group == j)[None, :], s.to(tl.int32)[:, None], scale)  # [BN, BK]
        # masked lanes are +0 (the high nibble past an odd k_end, a NaN group past it, a masked row)
        w = tl.where(mask, _mxfp4_values(code, scale), 0.0)                           # [BN, BK] fp32
        if OUT_DTYPE == tl.bfloat16:
            # exact as it stands, so bf16 is the upper half of the fp32 bits (the interpreter's
            # fp32 -> bf16 cast flushes subnormals, which scale 0 makes)
            w = (w.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
        else:
            w = w.to(OUT_DTYPE)
    else:
        w = tl.load(w_ptr + (expert * N + rn[:, None]) * K + col[None, :], mask=mask, other=0.0)
    return w


@triton.jit
def _chunk_acc(a_ptr, rows, r_ok, A_STRIDE, w_ptr, s_ptr, expert, rn, n_ok, N, K, lo, width,
               alpha, limit, SWIGLU: tl.constexpr, MXFP4: tl.constexpr, USE_DOT: tl.constexpr,
               PORTABLE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               ALIGNED: tl.constexpr = False, FAST_DECODE: tl.constexpr = True):
    """acc[m, n] = sum_j a[rows[m], lo + j] * W[expert, rn[n], lo + j], j in [0, width): fp32, from 0,
    in BLOCK_K steps first to last, each step the tile product of `_linear_kernel`. MXFP4 weights
    take the fast decode when `_mxfp4_fast_ok` holds for the program's rows and chunk (decided once,
    a uniform branch): the same tile values, so the same bits, either way. ALIGNED: the caller's
    promise that lo % 32 == 0 (every tile starts a scale group). FAST_DECODE = False: the exact
    decode everywhere (the kernels before the fast path; benchmarks and tests compare the two)."""
    if MXFP4:
        fast = False
        if FAST_DECODE:
            fast = _mxfp4_fast_ok(s_ptr, expert * N + rn, n_ok, K, lo, width, BLOCK_N)
        if fast:
            acc = _chunk_loop(a_ptr, rows, r_ok, A_STRIDE, w_ptr, s_ptr, expert, rn, n_ok, N, K, lo, width, alpha,
                              limit, SWIGLU, True, True, ALIGNED, USE_DOT, PORTABLE, BLOCK_M, BLOCK_N, BLOCK_K)
        else:
            acc = _chunk_loop(a_ptr, rows, r_ok, A_STRIDE, w_ptr, s_ptr, expert, rn, n_ok, N, K, lo, width, alpha,
                              limit, SWIGLU, True, False, False, USE_DOT, PORTABLE, BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        acc = _chunk_loop(a_ptr, rows, r_ok, A_STRIDE, w_ptr, s_ptr, expert, rn, n_ok, N, K, lo, width, alpha,
                          limit, SWIGLU, False, False, False, USE_DOT, PORTABLE, BLOCK_M, BLOCK_N, BLOCK_K)
    return acc


@triton.jit
def _chunk_loop(a_ptr, rows, r_ok, A_STRIDE, w_ptr, s_ptr, expert, rn, n_ok, N, K, lo, width,
                alpha, limit, SWIGLU: tl.constexpr, MXFP4: tl.constexpr, FAST: tl.constexpr,
                ALIGNED: tl.constexpr, USE_DOT: tl.constexpr, PORTABLE: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """`_chunk_acc`'s K loop, with the MXFP4 decode FAST or exact. FAST runs the whole tiles in the
    loop and the partial one after it (the same steps in the same order), so only that last tile
    masks the bytes past the chunk's end."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if FAST:
        for j0 in range(0, width - BLOCK_K + 1, BLOCK_K):                # the whole tiles
            acc = _chunk_step(acc, a_ptr, rows, r_ok, A_STRIDE, w_ptr, s_ptr, expert, rn, n_ok, N, K, lo, width,
                              j0, alpha, limit, SWIGLU, MXFP4, True, ALIGNED, True, USE_DOT, PORTABLE,
                              BLOCK_N, BLOCK_K)
        if width % BLOCK_K != 0:                                         # then the partial one
            acc = _chunk_step(acc, a_ptr, rows, r_ok, A_STRIDE, w_ptr, s_ptr, expert, rn, n_ok, N, K, lo, width,
                              width - width % BLOCK_K, alpha, limit, SWIGLU, MXFP4, True, ALIGNED, False,
                              USE_DOT, PORTABLE, BLOCK_N, BLOCK_K)
    else:
        for j0 in range(0, width, BLOCK_K):                                  # one fixed order
            acc = _chunk_step(acc, a_ptr, rows, r_ok, A_STRIDE, w_ptr, s_ptr, expert, rn, n_ok, N, K, lo, width,
                              j0, alpha, limit, SWIGLU, MXFP4, False, False, False, USE_DOT, PORTABLE,
                              BLOCK_N, BLOCK_K)
    return acc


@triton.jit
def _chunk_step(acc, a_ptr, rows, r_ok, A_STRIDE, w_ptr, s_ptr, expert, rn, n_ok, N, K, lo, width, j0,
                alpha, limit, SWIGLU: tl.constexpr, MXFP4: tl.constexpr, FAST: tl.constexpr,
                ALIGNED: tl.constexpr, WHOLE: tl.constexpr, USE_DOT: tl.constexpr, PORTABLE: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc plus the tile product of chunk columns j0 .. j0 + BLOCK_K - 1 (WHOLE: all inside the chunk)."""
    rk = j0 + tl.arange(0, BLOCK_K)                                      # [BK] chunk-relative
    k_ok = rk < width
    col = lo + rk                                                        # [BK] weight columns
    a = _load_a_tile(a_ptr, rows, r_ok, A_STRIDE, col, k_ok, alpha, limit, SWIGLU, PORTABLE)   # [BM, BK]
    w = _load_w_tile(w_ptr, s_ptr, expert, rn, n_ok, lo + j0, lo + width, N, K, MXFP4,
                     a_ptr.dtype.element_ty, BLOCK_N, BLOCK_K, FAST, ALIGNED, WHOLE)   # [BN, BK]
    if USE_DOT:
        acc = tl.dot(a, tl.trans(w), acc, input_precision="ieee")        # [BM, BN]
    else:
        prod = a.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]   # [BM, BN, BK]
        acc += tl.sum(prod, axis=2)
    return acc


# M not specialized, as in _linear_kernel: it only masks and indexes rows.
@triton.jit(do_not_specialize=["M"])
def _linear_chunks_kernel(x_ptr, w_ptr, bounds_ptr, y_ptr, M, N, K, X_STRIDE, alpha, limit,
                          SWIGLU: tl.constexpr, USE_DOT: tl.constexpr, PORTABLE: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          DIV: tl.constexpr = 1):
    # program (pid_n, pid_m, c) computes parts[c, rm, rn]; x [M, X_STRIDE], W [N, K], bounds [C, 2],
    # parts [C, M, N] fp32, all row-major. DIV: bounds_div of the bounds (a hint for vector loads).
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    c = tl.program_id(2)
    rm, rn, m_ok, n_ok = _output_tile(pid_n, pid_m, M, N, BLOCK_M, BLOCK_N)
    lo = tl.load(bounds_ptr + 2 * c)
    hi = tl.load(bounds_ptr + 2 * c + 1)
    if DIV > 1:
        lo = tl.multiple_of(lo, DIV)
        hi = tl.multiple_of(hi, DIV)
    width = hi - lo
    acc = _chunk_acc(x_ptr, rm, m_ok, X_STRIDE, w_ptr, w_ptr, 0, rn, n_ok, N, K, lo, width, alpha, limit,
                     SWIGLU, False, USE_DOT, PORTABLE, BLOCK_M, BLOCK_N, BLOCK_K)
    tl.store(y_ptr + (c * M + rm[:, None]) * N + rn[None, :], acc, mask=m_ok[:, None] & n_ok[None, :])


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
    bm, bn, bk, warps, stages = tiles(N, K, x.dtype, M)
    grid = (triton.cdiv(N, bn), triton.cdiv(M, bm))
    _linear_kernel[grid](x, weight, bias if bias is not None else x, y, M, N, K,
                         HAS_BIAS=bias is not None, USE_DOT=USE_DOT,
                         BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages,
                         enable_fp_fusion=True)
    return y


def linear_chunks_triton(x: torch.Tensor, weight: torch.Tensor, bounds,
                         prologue_swiglu: tuple[float, float] | None = None) -> torch.Tensor:
    """x [M, x_per_k * K], weight [N, K], bounds: C column ranges (lo, hi) of weight
    -> parts [C, M, N] fp32, parts[c] = a[:, lo:hi] @ weight[:, lo:hi]^T (no bias), one launch.
    a = x (x_per_k = 1), or with prologue_swiglu = (alpha, limit) the clamped SwiGLU of x's
    interleaved gate/up pairs (x_per_k = 2), computed as kernels.moe.clamped_swiglu_triton does and
    rounded to x's dtype. Each element's bits: those of linear_triton on the chunk's fresh copy."""
    check_float("x", x, 2)
    check_float("weight", weight, 2)
    x_per_k = 1 if prologue_swiglu is None else 2
    M, N, K = x.shape[0], weight.shape[0], weight.shape[1]
    if x.shape[1] != x_per_k * K:
        raise ValueError(f"linear_chunks: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit "
                         f"[M, {x_per_k} * K] x [N, K]")
    if weight.dtype != x.dtype or weight.device != x.device:
        raise ValueError(f"linear_chunks: weight ({weight.dtype}, {weight.device}) must match x ({x.dtype}, {x.device})")
    b = bounds_tensor(bounds, K, x.device)                               # [C, 2] int64
    alpha, limit = prologue_swiglu if prologue_swiglu is not None else (0.0, 0.0)
    # every element is stored by its program (the grid covers all of C x M x N): no zero fill first
    # (a prefill's o_proj partials are 189 MB a layer)
    parts = torch.empty((b.shape[0], M, N), dtype=torch.float32, device=x.device)
    if M == 0 or N == 0 or b.shape[0] == 0:
        return parts
    bm, bn, bk, warps, stages = tiles(N, K, x.dtype, M, chunks=b.shape[0])
    grid = (triton.cdiv(N, bn), triton.cdiv(M, bm), b.shape[0])
    _linear_chunks_kernel[grid](x.contiguous(), weight.contiguous(), b, parts, M, N, K, x_per_k * K,
                                float(alpha), float(limit), SWIGLU=prologue_swiglu is not None,
                                USE_DOT=USE_DOT, PORTABLE=PORTABLE_MATH, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                DIV=bounds_div(bounds), num_warps=warps, num_stages=stages, enable_fp_fusion=True)
    return parts


_BOUNDS: dict = {}


def bounds_div(bounds) -> int:
    """The largest power of two up to 32 dividing every chunk's first and last column (host ints: no
    sync). A compiled chunk kernel told it (`tl.multiple_of` on both ends) loads 8 bf16 (4 fp32)
    columns at once and pipelines them (cp.async); without it, a chunk's runtime ends make every
    load a scalar one: sm_90 SASS of the 20b down chunks had 2-byte `LDG.E.U16` for every weight and
    activation value and no `LDGSTS`, against 16-byte `LDGSTS.128` with it. Only a hint: the same
    values, so the same bits."""
    div = 32
    for chunk in bounds:
        for end in chunk:
            while end % div:
                div //= 2
    return div


def bounds_tensor(bounds, K: int, device: torch.device) -> torch.Tensor:
    """Chunk bounds [(lo, hi), ...] with 0 <= lo <= hi <= K -> a [C, 2] int64 tensor on `device`,
    made once per (bounds, device) and cached: a decode step that reuses it copies nothing from the
    host (CUDA-graph capturable once warmed up)."""
    pairs = []
    for chunk in bounds:
        try:
            lo, hi = chunk
        except (TypeError, ValueError):
            raise ValueError(f"bounds must be (lo, hi) pairs of ints, got {chunk!r}") from None
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (lo, hi)) or not 0 <= lo <= hi <= K:
            raise ValueError(f"bounds: chunk {chunk!r} is not a pair of ints with 0 <= lo <= hi <= {K}")
        pairs.append((lo, hi))
    key = (tuple(pairs), str(device))
    if key not in _BOUNDS:
        _BOUNDS[key] = torch.tensor(pairs, dtype=torch.int64, device=device).reshape(-1, 2)
    return _BOUNDS[key]


# --------------------------------------------------------------------------- torch references
def linear_portable(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The bit-exact reference (the same bits on every machine, whatever the batch): x [M, K],
    weight [N, K] (fp32 or bf16), bias [N] or None -> [M, N]. Each product x[m, k] * W[n, k] one
    rounded fp32 multiply (a product of two bf16 values is exact in fp32), the K products added in
    kernels.portable's fixed pairwise tree (matmul_nt), the bias added in fp32, the result rounded
    once to out_dtype (default: x's dtype). torch's own matmul is neither batch invariant nor
    portable (MKL picks its kernel, blocking and vector width by M and by the CPU). The torch ops
    table's linear; the matmul kernel specs compare linear_triton against it."""
    out_dtype = out_dtype or x.dtype
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit [M, K] x [N, K]")
    y = matmul_nt(x.to(torch.float32), weight.to(torch.float32))   # [M, N], fixed-order K sums
    y = y if bias is None else torch.add(y, bias)
    return y.to(out_dtype)


def linear_chunks_portable(x: torch.Tensor, weight: torch.Tensor, bounds, prologue=None,
                           x_per_k: int = 1) -> list[torch.Tensor]:
    """The bit-exact reference of linear_chunks_triton: one [M, N] fp32 partial product per (lo, hi)
    in `bounds` (columns of weight), no bias.

    Chunk c's input is x[:, x_per_k*lo : x_per_k*hi] passed through `prologue` if given (e.g.
    the clamped SwiGLU: x_per_k = 2 interleaved gate/up columns per K column; it is elementwise).
    Each chunk is reduced as one call on a fresh contiguous copy of it would reduce it, so the
    bits are the same whether the full K or one rank's slice of it is at hand (every TP degree).
    A portable matmul per chunk (all at once for equal adjacent chunks). The torch ops table's
    row-parallel partials (engine/linear.py adds them in the fixed tree)."""
    bounds = list(bounds)
    if _equal_adjacent(bounds):
        return _partials_at_once(x, weight, bounds, prologue, x_per_k)
    parts = []
    for lo, hi in bounds:
        xc = x[:, x_per_k * lo:x_per_k * hi].clone(memory_format=torch.contiguous_format)  # fresh
        if prologue is not None:
            xc = prologue(xc).contiguous()
        wc = weight[:, lo:hi].clone(memory_format=torch.contiguous_format)
        parts.append(linear_portable(xc, wc, None, out_dtype=torch.float32))
    return parts


def _equal_adjacent(bounds) -> bool:
    return bool(bounds) and bounds[0][1] > bounds[0][0] and all(
        hi - lo == bounds[0][1] - bounds[0][0] and lo == prev_hi
        for (lo, hi), (_, prev_hi) in zip(bounds[1:], bounds[:-1]))


def _partials_at_once(x, weight, bounds, prologue, x_per_k) -> list[torch.Tensor]:
    """The partials of equal adjacent chunks in one batched product: every element is the same
    tree_sum as chunk by chunk (the prologue is elementwise), in far fewer calls."""
    lo, hi, n = bounds[0][0], bounds[-1][1], len(bounds)
    w0 = bounds[0][1] - lo
    xs = x[:, x_per_k * lo:x_per_k * hi]
    if prologue is not None:
        xs = prologue(xs)                                                   # [M, n * w0]
    xs = xs.to(torch.float32).reshape(x.shape[0], n, w0).transpose(0, 1)   # [n, M, w0]
    ws = weight[:, lo:hi].to(torch.float32).reshape(weight.shape[0], n, w0).transpose(0, 1)   # [n, N, w0]
    return list(matmul_nt(xs, ws).unbind(0))                                # n x [M, N]


def linear_fast(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Values only: F.linear (cuBLAS / MKL), no invariance promise. The fast ops table's linear
    (bench/e2e.py measures what determinism costs); no spec uses it."""
    y = F.linear(x, weight, None if bias is None else bias.to(x.dtype))
    return y.to(out_dtype or x.dtype)


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


# --------------------------------------------------------------------------- the in-kernel MXFP4 decode alone
@triton.jit
def _mxfp4_decode_kernel(w_ptr, s_ptr, out_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # program (pid_n, pid_k): out[rn, pid_k * BK : (pid_k + 1) * BK] = the weight tile the matmuls load
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    n_ok = rn < N
    w = _load_w_tile(w_ptr, s_ptr, 0, rn, n_ok, pid_k * BLOCK_K, K, N, K, True, out_ptr.dtype.element_ty,
                     BLOCK_N, BLOCK_K)                                                # [BN, BK]
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(out_ptr + rn[:, None] * K + cols[None, :], w, mask=n_ok[:, None] & (cols < K)[None, :])


def mxfp4_decode_triton(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """blocks [N, G, 16] u8, scales [N, G] u8 -> [N, G * 32] in `dtype` (fp32 or bf16): the values
    the matmul and grouped-expert kernels decode in their tile loads (`_load_w_tile`), written out,
    so a spec can hold the in-kernel decode to engine/mxfp4.py's answers (scale 255: NaN)."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8 or blocks.dim() != 3 or blocks.shape[-1] != 16 \
            or scales.shape != blocks.shape[:2] or dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"mxfp4_decode_triton: blocks [N, G, 16] and scales [N, G] u8 to fp32 or bf16, got "
                         f"{blocks.dtype} {tuple(blocks.shape)}, {scales.dtype} {tuple(scales.shape)}, {dtype}")
    N, G = scales.shape
    out = torch.empty((N, G * 32), dtype=dtype, device=blocks.device)
    if N and G:
        block_n, block_k = 16, 64        # a K tail whenever G is odd, an N tail below 16 rows
        _mxfp4_decode_kernel[(triton.cdiv(N, block_n), triton.cdiv(G * 32, block_k))](
            blocks.contiguous(), scales.contiguous(), out, N, G * 32, BLOCK_N=block_n, BLOCK_K=block_k,
            enable_fp_fusion=True)
    return out


# --------------------------------------------------------------------------- the kernel spec's case
def _matmul_op(x, w, b=None):
    return linear_triton(x, w, b)


def _matmul_inputs(inp, s, d):
    return {"x": d.normal(s["M"], s["K"], scale=inp["scale"]), "w": d.normal(s["N"], s["K"], scale=s["K"] ** -0.5),
            "b": d.normal(s["N"])}


CASES = (KernelCase(
    name="matmul", dims=("M", "K", "N"), inputs=_matmul_inputs, op=_matmul_op,
    call=lambda op, x, r, offered: op(x["x"][r], x["w"], x["b"]),
    reference=lambda x: linear_portable(x["x"], x["w"], x["b"]),
    elements=lambda s: s["M"] * s["K"] + s["N"] * s["K"] + s["N"] + 2 * s["M"] * s["N"],
    note="lockstep.kernels.matmul.linear_triton"),)
