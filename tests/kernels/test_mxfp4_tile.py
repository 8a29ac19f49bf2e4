"""kernels/matmul.py `_load_w_tile` on MXFP4 weights, alone: every decoded tile equals
engine/mxfp4.py `dequantize` of the same columns, bit for bit, 0 where masked. NaN payloads
too: a scale-255 block is the quiet NaN 0x7FC00000 in fp32 on both sides; in bf16 the kernel
gives its upper half 0x7FC0 (its bf16 is the upper half of the exact fp32 bits), while torch's CPU
fp32 -> bf16 cast inside dequantize(dtype=bf16) gives 0xFFFF, so bf16 is compared with the upper
halves of dequantize's fp32 bits (which equal dequantize(dtype=bf16) everywhere else: checked).

Random codes, all 256 E8M0 scales (0 and 1: subnormal values; 254: +-inf; 255: NaN), fp32 and
bf16 tiles, an N tail, and tiles that start at any column (a down K-chunk starts where
engine.linear.k_chunk_bounds puts it: odd, mid-byte or mid-group) and end before the row does.
The grouped-expert tests (test_grouped_moe.py) check the same decode through the whole matmul."""

import pytest
import torch
import triton
import triton.language as tl

from lockstep.engine.mxfp4 import dequantize
from lockstep.kernels.matmul import MXFP4_FAST_SCALES, _load_w_tile, _mxfp4_fast_ok
from tests.kernels.conftest import DEVICE

E, N, K = 2, 37, 320                       # 10 scale groups per row; N = 37: a tail for BLOCK_N = 16
BLOCK_N = 16
# (first column, end) of the tiles' span: start + i * BLOCK_K, i = 0, 1, ... up to k_end
CASES = ((0, K),                  # aligned: every tile starts a scale group
         (1, K),                  # odd start: a column pair straddles two bytes
         (8, K - 1),              # mid-group, as the chunk at 360 of I = 2880; odd end: a masked high nibble
         (31, K), (32, 100), (33, 38), (40, 45), (150, 151), (K - 1, K))


@triton.jit
def _tile_kernel(w_ptr, s_ptr, out_ptr, expert, N, K, start, k_end, OUT_W,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FAST: tl.constexpr = False):
    # program (pid_n, pid_k): out[rn, pid_k * BK : (pid_k + 1) * BK] = the tile at column start + pid_k * BK;
    # FAST: the fast decode (the caller's promise: even bounds, scales in [2, 252])
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    n_ok = rn < N
    w = _load_w_tile(w_ptr, s_ptr, expert, rn, n_ok, start + pid_k * BLOCK_K, k_end, N, K, True,
                     out_ptr.dtype.element_ty, BLOCK_N, BLOCK_K, FAST)               # [BN, BK]
    cols = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(out_ptr + rn[:, None] * OUT_W + cols[None, :], w, mask=n_ok[:, None])


def packed_weight():
    """blocks [E, N, K/32, 16] of random bytes; scales [E, N, K/32] holding each of 0..255 once
    per expert, the rest random."""
    g = torch.Generator().manual_seed(7)
    blocks = torch.randint(0, 256, (E, N, K // 32, 16), generator=g, dtype=torch.int64).to(torch.uint8)
    scales = torch.randint(0, 256, (E, N, K // 32), generator=g, dtype=torch.int64)
    for e in range(E):
        flat = scales[e].reshape(-1)
        flat[torch.randperm(flat.numel(), generator=g)[:256]] = torch.randperm(256, generator=g)
    return blocks, scales.to(torch.uint8)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def expected_bits(blocks, scales, dtype) -> torch.Tensor:
    """dequantize's values [E, N, K] as int32 (fp32) or int16 (bf16: the upper half of the fp32 bits)."""
    dense = bits(dequantize(blocks, scales, torch.float32))
    if dtype == torch.float32:
        return dense
    upper = (dense >> 16).to(torch.int16)
    via_torch = dequantize(blocks, scales, torch.bfloat16)
    nan = torch.isnan(via_torch)
    assert upper[~nan].equal(bits(via_torch)[~nan]) and (upper[nan] == 0x7FC0).all()
    return upper


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_k", [64, 128])                  # the GPU tiles and the interpreter's
def test_mxfp4_tile_decode_is_dequantize(dtype, block_k):
    blocks, scales = packed_weight()
    assert all(set(scales[e].reshape(-1).tolist()) == set(range(256)) for e in range(E))
    dense = dequantize(blocks, scales, dtype)                                           # [E, N, K]
    want_bits = expected_bits(blocks, scales, dtype)                                    # [E, N, K]
    w, s = blocks.to(DEVICE), scales.to(DEVICE)
    for start, k_end in CASES:
        n_tiles = triton.cdiv(k_end - start, block_k)
        for expert in range(E):
            out = torch.full((N, n_tiles * block_k), 7.0, dtype=dtype, device=DEVICE)   # every element written
            _tile_kernel[(triton.cdiv(N, BLOCK_N), n_tiles)](w, s, out, expert, N, K, start, k_end, out.shape[1],
                                                             BLOCK_N=BLOCK_N, BLOCK_K=block_k)
            want = torch.zeros((N, n_tiles * block_k), dtype=want_bits.dtype)              # masked: +0
            want[:, :k_end - start] = want_bits[expert, :, start:k_end]
            assert bits(out.cpu()).equal(want), (start, k_end, expert)
    subnormal = (dense != 0) & (dense.abs() < 2 ** -126)
    assert torch.isnan(dense).any() and torch.isinf(dense).any() and subnormal.any()


# ------------------------------------------------------------------ the fast decode
@triton.jit
def _fast_ok_kernel(s_ptr, out_ptr, expert, N, K, lo, width, BLOCK_N: tl.constexpr):
    # one program per BLOCK_N rows: out[pid] = _mxfp4_fast_ok of its rows over [lo, lo + width)
    rn = (tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    ok = _mxfp4_fast_ok(s_ptr, expert * N + rn, rn < N, K, lo, width, BLOCK_N)
    tl.store(out_ptr + tl.program_id(0), ok.to(tl.int32))


FAST_CASES = ((0, K), (8, K - 2), (32, 100), (40, 46), (150, 152), (K - 2, K), (2, 2 + 256 + 16))


def fast_range_weight():
    """packed_weight() with every scale moved into the fast range [2, 252], each of its values
    present in every expert."""
    blocks, scales = packed_weight()
    lo, hi = MXFP4_FAST_SCALES
    return blocks, (scales.to(torch.int64) % (hi - lo + 1) + lo).to(torch.uint8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_k", [64, 128])
def test_mxfp4_fast_tile_is_dequantize(dtype, block_k):
    """Every code at every scale of the fast range, tiles starting mid-group and ending mid-row: the
    fast decode's bits are dequantize's (so those of the exact decode, test above)."""
    blocks, scales = fast_range_weight()
    lo, hi = MXFP4_FAST_SCALES
    assert all(set(scales[e].reshape(-1).tolist()) == set(range(lo, hi + 1)) for e in range(E))
    want_bits = expected_bits(blocks, scales, dtype)                                    # [E, N, K]
    w, s = blocks.to(DEVICE), scales.to(DEVICE)
    for start, k_end in FAST_CASES:
        n_tiles = triton.cdiv(k_end - start, block_k)
        for expert in range(E):
            out = torch.full((N, n_tiles * block_k), 7.0, dtype=dtype, device=DEVICE)
            _tile_kernel[(triton.cdiv(N, BLOCK_N), n_tiles)](w, s, out, expert, N, K, start, k_end, out.shape[1],
                                                             BLOCK_N=BLOCK_N, BLOCK_K=block_k, FAST=True)
            want = torch.zeros((N, n_tiles * block_k), dtype=want_bits.dtype)
            want[:, :k_end - start] = want_bits[expert, :, start:k_end]
            assert bits(out.cpu()).equal(want), (start, k_end, expert)


def test_mxfp4_fast_path_only_where_it_is_exact():
    """_mxfp4_fast_ok: False for an odd bound or one scale out of [2, 252] among the groups the
    columns touch (in a real row); a bad scale outside the columns or in a masked row does not count."""
    blocks, scales = fast_range_weight()
    n_progs = triton.cdiv(N, BLOCK_N)

    def fast_ok(scales, lo, width, expert=1):
        out = torch.full((n_progs,), -1, dtype=torch.int32, device=DEVICE)
        _fast_ok_kernel[(n_progs,)](scales.to(DEVICE), out, expert, N, K, lo, width, BLOCK_N=BLOCK_N)
        return out.cpu().tolist()
    assert fast_ok(scales, 40, 200) == [1] * n_progs
    assert fast_ok(scales, 41, 200) == [0] * n_progs and fast_ok(scales, 40, 201) == [0] * n_progs
    for bad in (0, 1, 253, 254, 255):
        edited = scales.clone()
        edited[1, 20, 7] = bad                                  # row 20 (program 1), columns 224..255
        assert fast_ok(edited, 40, 200) == [1, 0, 1]            # touched: 40 .. 239
        assert fast_ok(edited, 40, 184) == [1] * n_progs        # 40 .. 223: group 7 untouched
        assert fast_ok(edited, 40, 200, expert=0) == [1] * n_progs
