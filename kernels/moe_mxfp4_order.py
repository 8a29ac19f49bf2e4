"""A large MXFP4 prefill as dense tiles (DESIGN §7): the MXFP4 experts decoded once into the
packed kernels' MMA order, so dense tiles over them give the packed kernels' bits.

    mma_order_triton / _portable(MXFP4 weight, bounds) -> [E_l, N, KP], with mma_order_columns(bounds)
        and gather_columns(x, cols); mxfp4_dense(rows, n_local, dtype) says when the engine takes it.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from lockstep.kernels import _common  # noqa: F401  (first: it sets TRITON_INTERPRET before triton is imported)
import triton
import triton.language as tl

from lockstep.kernels._common import INTERPRET
from lockstep.kernels.matmul import _load_w_tile, _mxfp4_fast_ok, bounds_div
from lockstep.kernels.mxfp4 import dequantize


def _lo_div(bounds) -> int:
    """The largest power of two up to 32 dividing every chunk's first column (host ints: no sync):
    the MXFP4 launches' hint (their last column unhinted, as their bits were recorded on the H200;
    the dense launches take kernels.matmul bounds_div, both ends)."""
    return bounds_div([(lo,) for lo, _ in bounds])


# The compiled MXFP4 kernels reduce each 64-column K step (BLOCK_K of every MXFP4_GPU_TILES entry)
# as four 16-wide MMAs, the i-th over the column pairs (2j, 2j + 1) with j % 4 == i: the order in
# which Triton's sm_90 mma.sync takes a tile decoded in registers (dot operands of kWidth 4). Dense
# bf16 tiles take their columns in memory order, 16 at a time, and whatever their rows per block
# (mma.sync or wgmma) or BLOCK_K, so a dense launch over the weights decoded into that order (and
# the activations gathered alike, a chunk's last step padded with zeros as the MXFP4 kernel masks
# it) gives the MXFP4 kernels' bits, with 64- and 128-row blocks that MXFP4's own layout cannot take
# (MXFP4_MAX_BLOCK_M). An H200 run found the same bits for this order alone among 13 candidates
# (docs/history/benchmarks.md), and tests/kernels/test_mxfp4_mma_order.py holds it compiled. Large prefills
# only: the decode into that order (mma_order_triton: the packed kernels' own tile decode, then a
# register permute) writes a bf16 copy of the experts, 1.5 ms a 20b layer on an H200, so the packed
# kernels stay faster for small launches. bench/mxfp4_dense.py: dense / packed 1.34x at 64 rows an
# expert, 0.88x at 128, 0.59x at 256 (a 2048-token prefill): MXFP4_DENSE_MIN_ROWS = 128.
MXFP4_STEP = 64


MXFP4_DENSE_MIN_ROWS = 128


def mxfp4_dense(rows: int, n_local: int, dtype: torch.dtype) -> bool:
    """Whether a grouped MXFP4 launch of `rows` rows over n_local experts runs as dense tiles over
    its weights decoded in MMA order: compiled only (the interpreter's tile sums are elementwise, in
    column order), 16-bit activations, MXFP4_DENSE_MIN_ROWS rows an expert. Shapes alone decide."""
    return not INTERPRET and dtype != torch.float32 and rows // max(n_local, 1) >= MXFP4_DENSE_MIN_ROWS


def _mma_position(c):
    """Column c of a 64-column step -> its position in MMA order: c = 8q + 2i + b (pair j = 4q + i,
    b its half) goes to MMA i, after the q earlier pairs: 16i + 2q + b."""
    q, r = divmod(c, 8)
    return 16 * (r // 2) + 2 * q + r % 2


def mma_order_columns(bounds, K: int, device) -> tuple[torch.Tensor, tuple[tuple[int, int], ...]]:
    """bounds: C column ranges of K -> (cols [KP] int64, padded bounds): for each chunk, its
    MXFP4_STEP-column steps from its first column, each step's columns in the MMA order above;
    cols[p] is the weight column at position p, K where a chunk's last step is past its end (a zero
    column); the padded bounds are the chunks' ranges of positions. Kept per (bounds, K, device):
    every layer asks the same (the tensor is shared; nothing writes it)."""
    return _mma_order_columns(_check_bounds(bounds, K), int(K), torch.device(device))[:2]


@lru_cache(maxsize=64)
def _mma_order_columns(bounds, K, device):
    """-> (cols, padded bounds, steps [S, 2] int32: each step's first column and its chunk's end)."""
    order = sorted(range(MXFP4_STEP), key=_mma_position)                 # position -> column
    cols, padded, steps = [], [], []
    for lo, hi in bounds:
        start = len(cols)
        for j0 in range(lo, hi, MXFP4_STEP):
            cols += [j0 + c if j0 + c < hi else K for c in order]
            steps.append((j0, hi))
        padded.append((start, len(cols)))
    return (torch.tensor(cols, dtype=torch.int64, device=device), tuple(padded),
            torch.tensor(steps, dtype=torch.int32, device=device).reshape(-1, 2))


def _check_bounds(bounds, K) -> tuple[tuple[int, int], ...]:
    """Host ints (a prefill's launch, never a captured step): each chunk a nonempty range in [0, K]."""
    bounds = tuple((int(lo), int(hi)) for lo, hi in bounds)
    bad = [(lo, hi) for lo, hi in bounds if not 0 <= lo < hi <= K]
    if bad:
        raise ValueError(f"mma_order: chunks must be nonempty column ranges within [0, {K}], got {bad[:3]}")
    return bounds


def gather_columns(x: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """x [..., K], cols from mma_order_columns -> [..., KP]: x's columns at those positions, 0 where
    cols is K."""
    return torch.cat([x, x.new_zeros(x.shape[:-1] + (1,))], dim=-1).index_select(-1, cols)


@triton.jit
def _mma_order_kernel(w_ptr, s_ptr, steps_ptr, out_ptr, N, K, KP, BLOCK_N: tl.constexpr, DIV: tl.constexpr):
    # program (step, N tile, expert): the step's 64 columns j0 + c (c < 64; +0 from the chunk's end
    # hi on) of rows rn, decoded as the packed kernels decode a tile (`_load_w_tile`, the fast path
    # where `_mxfp4_fast_ok` allows), then moved into MMA order (c = 8q + 2i + b -> 16i + 2q + b, a
    # register permute) and stored as 64 contiguous positions. blocks [E, N, K/32, 16] u8, scales
    # [E, N, K/32], out [E, N, KP]. DIV: a power of two dividing every j0 (vector byte loads).
    s = tl.program_id(0)
    rn = (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)  # [BN]
    e = tl.program_id(2).to(tl.int64)
    n_ok = rn < N
    j0 = tl.load(steps_ptr + 2 * s)
    if DIV > 1:
        j0 = tl.multiple_of(j0, DIV)
    hi = tl.load(steps_ptr + 2 * s + 1)
    width = tl.minimum(hi - j0, 64)
    if _mxfp4_fast_ok(s_ptr, e * N + rn, n_ok, K, j0, width, BLOCK_N):
        w = _load_w_tile(w_ptr, s_ptr, e, rn, n_ok, j0, hi, N, K, True, out_ptr.dtype.element_ty, BLOCK_N, 64,
                         True, False, False)                                # [BN, 64] column order
    else:
        w = _load_w_tile(w_ptr, s_ptr, e, rn, n_ok, j0, hi, N, K, True, out_ptr.dtype.element_ty, BLOCK_N, 64)
    w = tl.reshape(tl.permute(tl.reshape(w, (BLOCK_N, 8, 4, 2)), (0, 2, 1, 3)), (BLOCK_N, 64))   # MMA order
    p = s * 64 + tl.arange(0, 64)
    tl.store(out_ptr + (e * N + rn)[:, None] * KP + p[None, :], w, mask=n_ok[:, None])


def mma_order_triton(weight, bounds, dtype: torch.dtype) -> torch.Tensor:
    """MXFP4 weight (blocks [E, N, K/32, 16], scales [E, N, K/32]) and its K chunks -> [E, N, KP] in
    dtype: position p holds the decoded column mma_order_columns(bounds)[0][p] (exact in fp32 and
    bf16), +0 where that is K (a chunk's last step past its end). One launch, a program per
    (64-column step, N tile, expert)."""
    blocks, scales = _check_mma_order(weight, dtype)
    E, N, K = blocks.shape[0], blocks.shape[1], 32 * blocks.shape[2]
    bounds = _check_bounds(bounds, K)
    _, _, steps = _mma_order_columns(bounds, K, blocks.device)
    out = torch.empty((E, N, MXFP4_STEP * steps.shape[0]), dtype=dtype, device=blocks.device)
    if out.numel() == 0:
        return out
    bn = 64 if not INTERPRET else 16
    div = _lo_div(bounds)                                                   # steps are lo + 64 s
    _mma_order_kernel[(steps.shape[0], triton.cdiv(N, bn), E)](blocks.contiguous(), scales.contiguous(), steps, out,
                                                               N, K, out.shape[2], BLOCK_N=bn, DIV=div,
                                                               enable_fp_fusion=True)
    return out


def _check_mma_order(weight, dtype):
    """-> (blocks, scales), or ValueError naming what does not fit."""
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"mma_order: MXFP4 decodes to float32 or bfloat16, got {dtype}")
    if not (isinstance(weight, tuple) and len(weight) == 2
            and all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 for t in weight)):
        raise ValueError("mma_order: the weight must be an MXFP4 (blocks, scales) pair of uint8 tensors")
    blocks, scales = weight
    if blocks.dim() != 4 or blocks.shape[-1] != 16 or scales.shape != blocks.shape[:3] or scales.device != blocks.device:
        raise ValueError(f"mma_order: MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not fit "
                         f"[E, N, K/32, 16] and [E, N, K/32] on one device")
    return blocks, scales


def mma_order_portable(weight, bounds, dtype: torch.dtype) -> torch.Tensor:
    """mma_order_triton with kernels/mxfp4.py's `dequantize` and mma_order_columns' gather: the
    reference the tests hold it to."""
    blocks, scales = _check_mma_order(weight, dtype)
    cols, _ = mma_order_columns(bounds, 32 * blocks.shape[2], blocks.device)
    return gather_columns(dequantize(blocks, scales, dtype), cols)             # [E, N, KP]
