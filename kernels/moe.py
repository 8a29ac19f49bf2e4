"""gpt-oss mixture of experts (DESIGN §7, §8 expert parallelism): the experts' Triton kernels, each `_triton`
beside its bit-exact `_portable` reference (the callers pick one; nothing here dispatches). The
router is kernels/moe_router.py, the MXFP4 experts' MMA order kernels/moe_mxfp4_order.py.

    clamped_swiglu_triton / _portable(gate_up [R, 2I]) -> [R, I]
        gate = x[..., ::2] <= limit, up = x[..., 1::2] in [-limit, limit] (interleaved),
        gate * sigmoid(alpha * gate) * (up + 1)

Grouped experts (the engine's MoE on the Triton backend; one launch per op, no host sync):

    group_by_expert(flat_ids [R], expert_lo, n_local, block_m)
        -> sorted_rows [P] int64 (-1 = padding), block_expert [P / block_m] int64 (-1 = unused)
        each local expert's (token, slot) rows in increasing order, padded to whole blocks of
        block_m; P = (cdiv(R, block_m) + n_local) * block_m depends on R and n_local only.
    expert_block_m(R, n_local, dtype, mxfp4) -> block_m
        the rows per block the engine groups with: compiled, 16 for a decode step, up to 128 for
        a prefill (rows / n_local; MXFP4 up to 32); 16 in float32 and in the interpreter. The
        kernels read block_m off the groups' shapes.
    expert_gate_up_triton(x [T, H], k, groups, weight, bias [E_l, 2I]) -> h [R = T * k, 2I]
        h[r] = x[r // k] @ W[flat_ids[r]]^T + b, in x's dtype; rows of non-local experts stay 0.
    expert_down_partials_triton(a [R, I] | h [R, 2I], groups, weight, bounds, prologue_swiglu)
        -> parts [C, R, H] fp32: parts[c, r] = a[r, lo:hi] @ W[flat_ids[r]][:, lo:hi]^T (no
        bias); with prologue_swiglu = (alpha, limit), a = clamped_swiglu(h) computed in the load.
    weight: dense [E_l, N, K] (fp32 or bf16) or MXFP4 (blocks [E_l, N, K/32, 16] u8, scales
        [E_l, N, K/32] u8), decoded inside the kernel exactly as engine/mxfp4.py `dequantize`.
    a large MXFP4 prefill (mxfp4_dense) runs as dense tiles over the weights decoded into the
        MXFP4 kernels' MMA order, with their bits (kernels/moe_mxfp4_order.py).

A grouped program computes a [block_m, BLOCK_N] tile of one expert's rows with the tile loop of
kernels/matmul.py `_chunk_acc`: every element reduced over its chunk (gate_up: all of K) from 0,
in BLOCK_K steps first to last. A row's bits therefore depend only on its own input row, its
expert's weights and the chunk bounds: not on which other rows, experts or batch size share the
launch, nor on its place in its block, nor on block_m (so block_m may follow the launch's rows:
expert_block_m; tests/kernels/test_grouped_block_m.py holds every size to the same bits). They
equal linear_triton on the row's expert (gate_up) and on the chunk's fresh copy (down), the
per-expert path the engine used before.
"""

from __future__ import annotations

import torch
from lockstep.kernels import _common  # noqa: F401  (first: it sets TRITON_INTERPRET before triton is imported)
import triton
import triton.language as tl

from lockstep.kernels import portable
from lockstep.kernels._common import INTERPRET, PORTABLE_MATH, USE_DOT, check_float, next_pow2
from lockstep.kernels.case import KernelCase
from lockstep.kernels.matmul import TILES, _chunk_acc, bounds_div, bounds_tensor
from lockstep.kernels.moe_mxfp4_order import MXFP4_STEP, _lo_div
# The router's and the MMA order's public names, importable from here too.
from lockstep.kernels.moe_mxfp4_order import (MXFP4_DENSE_MIN_ROWS, gather_columns,  # noqa: F401
                                              mma_order_columns, mma_order_portable, mma_order_triton, mxfp4_dense)
from lockstep.kernels.moe_router import (router_top_k_fast, router_top_k_portable,  # noqa: F401
                                         router_top_k_triton, routing_weights, top_k_lowest_index)
from lockstep.kernels.portable_tl import cast_rne, sigmoid_f32


BLOCK_H = 1024


# Rows per block of a grouped expert launch (group_by_expert pads every expert to whole blocks):
# one of EXPERT_BLOCK_SIZES, picked by expert_block_m from the launch's shape. EXPERT_BLOCK_M is
# the decode size, tl.dot's smallest M, so a decode step wastes little.
EXPERT_BLOCK_M = 16


EXPERT_BLOCK_SIZES = (16, 32, 64, 128)


# Compiled only: the interpreter's tile product [BLOCK_M, BLOCK_N, BLOCK_K] = [128, 128, 128] is
# past Triton's largest tensor (2^20 elements), and numpy gains nothing from fewer weight reads.
EXPERT_BLOCK_FOLLOWS_ROWS = not INTERPRET


# The largest block MXFP4 packed weights take. Their recorded bits are those of sm_90's mma.sync
# with the weight decoded in registers, where Triton feeds both operands in kWidth = 4: each 64-column
# K step runs as four 16-wide MMAs over interleaved column pairs (measured: kernels/moe_mxfp4_order.py),
# where loaded dense tiles take 16 consecutive columns an MMA, hence the ulp differences between the
# two (docs/history/benchmarks.md). BLOCK_M 16 and 32 compile to that same mma.sync layout; from 64 Triton
# takes wgmma with both operands in shared memory (sm_90 TTGIR under Triton 3.9), a different order
# within a step, so 64 and 128 would very likely move MXFP4 bits: 32 is the cap.
# bench/moe.py --block-m-T marks each size whose bits differ from 16's; raising the cap puts the
# new sizes under tests/kernels/test_grouped_block_m.py (16: MXFP4 keeps 16 rows a block).
MXFP4_MAX_BLOCK_M = 32


# GPU tiles (BLOCK_N, BLOCK_K, num_warps, num_stages) of the grouped expert kernels (dense bf16,
# fp16 and fp32: fp32 always takes 16-row blocks), by kernel and rows per block: the fastest with
# bench/expert_tiles.py on an H200 at 20b shapes, decode (1 and 32 tokens) for 16 rows and 256, 512
# and 2048 tokens for 32, 64 and 128 (the sizes expert_block_m picks there; 128 rows: gate_up 0.59x
# and down 0.72x the time of the 16-row tiles they took before). Down was swept again once its loads
# were vectorized (kernels.matmul bounds_div): 16 rows (64, 128, 4, 3), 0.93x at 1 token and 0.96x
# at 32; 128 rows (256, 64, 8, 3), 0.76x at 16,384 tokens (a replay's forward). Every sweep
# candidate gave the same output bits; a tile never depends on the rows.
EXPERT_GPU_TILES = {("gate_up", 16): (64, 128, 4, 3), ("down", 16): (64, 128, 4, 3),
                    ("gate_up", 32): (256, 64, 8, 4), ("down", 32): (256, 64, 8, 3),
                    ("gate_up", 64): (128, 64, 8, 4), ("down", 64): (64, 64, 4, 3),
                    ("gate_up", 128): (256, 64, 8, 4), ("down", 128): (256, 64, 8, 3)}


# MXFP4 packed weights, by kernel and rows per block (bench/expert_tiles.py --dtype mxfp4 on an H200,
# the same bits for every candidate): gate_up steps 64 columns of K, not 128 (0.70x, 0.68x and 0.77x
# of the 128-step time at 1, 32 and 2048 tokens: the decode in registers is the step's cost); down
# takes 128 columns of N in the 32-row blocks of a prefill (0.80x at 2048 tokens), 64 in a decode's.
MXFP4_GPU_TILES = {("gate_up", 16): (64, 64, 4, 3), ("gate_up", 32): (64, 64, 4, 3),
                   ("down", 16): (64, 64, 4, 3), ("down", 32): (128, 64, 4, 3)}
assert all(bk == MXFP4_STEP for _, bk, _, _ in MXFP4_GPU_TILES.values())   # the order is a 64-column step's


def expert_block_m(rows: int, n_local: int, dtype: torch.dtype, mxfp4: bool = False) -> int:
    """Rows per block of a grouped expert launch of `rows` (token, slot) rows over n_local experts,
    `dtype` activations, MXFP4 packed weights or not: the largest of EXPERT_BLOCK_SIZES that the
    average expert fills (rows / n_local), at least EXPERT_BLOCK_M, MXFP4 at most MXFP4_MAX_BLOCK_M;
    always EXPERT_BLOCK_M in float32 and in the interpreter (EXPERT_BLOCK_FOLLOWS_ROWS).

    It may follow the rows because no output bit depends on it: each element is reduced over its
    chunk in BLOCK_K steps, first to last, whatever BLOCK_M is (in the interpreter an elementwise
    product and sum per row; compiled, the tl.dot K loop: an H200 sweep of 60 bf16 dense tiles,
    BLOCK_M 16-128, gave one set of bits, and tests/kernels/test_grouped_block_m.py pins every
    size here, dense and MXFP4 up to MXFP4_MAX_BLOCK_M, on the GPU). So a row's bits still never
    depend on the rows sharing its launch (D2).
    A block reads its expert's weights (and decodes its MXFP4 tiles) once, so larger blocks read
    them fewer times: a 20b prefill of 2048 tokens has 256 rows an expert, where the sweep's best
    128-row tiles took 0.30x (gate_up) and 0.55x (down) of the 16-row time; a decode step (at most
    a few rows an expert) keeps 16, the fastest there. On an expert-parallel rank `rows` counts
    every row of the launch, the other ranks' too: an over-estimate that costs only speed.
    float32 runs tl.dot as FMA chains (no tensor cores), where larger blocks only spill registers
    (an sm_90 compile of gate_up at 128 rows under Triton 3.9: 16 KB of stack), so it keeps 16."""
    if dtype == torch.float32 or not EXPERT_BLOCK_FOLLOWS_ROWS:
        return EXPERT_BLOCK_M
    per_expert = rows // max(n_local, 1)
    cap = MXFP4_MAX_BLOCK_M if mxfp4 else EXPERT_BLOCK_SIZES[-1]
    return max([EXPERT_BLOCK_M] + [bm for bm in EXPERT_BLOCK_SIZES if bm <= min(per_expert, cap)])


def expert_tiles(kernel: str, N: int, K: int, dtype: torch.dtype, mxfp4: bool = False,
                 block_m: int = EXPERT_BLOCK_M) -> tuple[int, int, int, int]:
    """(BLOCK_N, BLOCK_K, num_warps, num_stages) of a grouped expert kernel for a weight [E, N, K]
    (MXFP4 packed or not) in blocks of block_m rows: the linear kernels' interpreter tiles in the
    interpreter, compiled MXFP4_GPU_TILES or EXPERT_GPU_TILES."""
    if INTERPRET:
        return TILES[1:]
    if mxfp4:
        return MXFP4_GPU_TILES[kernel, min(block_m, MXFP4_MAX_BLOCK_M)]
    return EXPERT_GPU_TILES[kernel, block_m]


@triton.jit
def _swiglu_kernel(x_ptr, y_ptr, I, alpha, limit, BLOCK: tl.constexpr, PORTABLE: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = i < I
    gate = tl.load(x_ptr + r * 2 * I + 2 * i, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + r * 2 * I + 2 * i + 1, mask=ok, other=0.0).to(tl.float32)
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    y = gate * sigmoid_f32(alpha * gate, PORTABLE) * (up + 1.0)
    tl.store(y_ptr + r * I + i, cast_rne(y, y_ptr.dtype.element_ty), mask=ok)


# R (the rows, T * k) is not specialized, one compile for every batch: it only masks and indexes
# rows (a row's bits depend on its own x and expert alone). N, K (the weights') are.
@triton.jit(do_not_specialize=["R"])
def _grouped_gate_up_kernel(x_ptr, rows_ptr, bexp_ptr, w_ptr, s_ptr, b_ptr, h_ptr, R, N, K, TOP_K,
                            MXFP4: tl.constexpr, USE_DOT: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            FAST_DECODE: tl.constexpr = True):
    # program (pid_n, blk): h[rows, rn] for the rows of block blk (one expert); x [T, K],
    # h [R, N], rows [P] (-1 padding), bexp [P / BLOCK_M] (-1: unused block, return at once).
    # Rows outside [0, R) are masked (padding; and no groups made for another R can reach past h).
    pid_n = tl.program_id(0)
    blk = tl.program_id(1)
    e = tl.load(bexp_ptr + blk)
    if e >= 0:                                                           # program-uniform
        rows = tl.load(rows_ptr + blk * BLOCK_M + tl.arange(0, BLOCK_M))     # [BM] (token, slot) rows
        r_ok = (rows >= 0) & (rows < R)
        rows = tl.where(r_ok, rows, 0)
        tok = rows // TOP_K                                              # [BM] token of each row
        rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)      # [BN]
        n_ok = rn < N
        acc = _chunk_acc(x_ptr, tok, r_ok, K, w_ptr, s_ptr, e, rn, n_ok, N, K, 0, K, 0.0, 0.0,
                         False, MXFP4, USE_DOT, False, BLOCK_M, BLOCK_N, BLOCK_K, True, FAST_DECODE)   # [BM, BN]
        acc += tl.load(b_ptr + e * N + rn, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(h_ptr + rows[:, None] * N + rn[None, :], cast_rne(acc, h_ptr.dtype.element_ty),
                 mask=r_ok[:, None] & n_ok[None, :])


# R not specialized, as in _grouped_gate_up_kernel: it only masks and indexes rows.
@triton.jit(do_not_specialize=["R"])
def _grouped_down_kernel(a_ptr, rows_ptr, bexp_ptr, w_ptr, s_ptr, bounds_ptr, y_ptr, R, N, K, A_STRIDE, C,
                         alpha, limit, SWIGLU: tl.constexpr, MXFP4: tl.constexpr, USE_DOT: tl.constexpr,
                         PORTABLE: tl.constexpr, CHUNK_LOOP: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LO_DIV: tl.constexpr = 1,
                         FAST_DECODE: tl.constexpr = True, HI_DIV: tl.constexpr = 1):
    # program (c, pid_n, blk): parts[c, rows, rn] of chunk c for the rows of block blk; a [R, A_STRIDE],
    # W [E, N, K] (or MXFP4), bounds [C, 2], parts [C, R, N] fp32. The chunk is the fastest axis, so
    # programs launched together read whole weight rows, not a 360-column stripe of each (0.94x the
    # time at 32 tokens). CHUNK_LOOP: program (0, pid_n, blk) computes every chunk in turn, c = 0 ..
    # C-1 (each from 0, as its own program would: the same bits).
    # LO_DIV, HI_DIV: powers of two dividing every chunk's first and last column (hints for vector
    # loads, kernels.matmul bounds_div; LO_DIV 32: the MXFP4 tiles start scale groups).
    pid_n = tl.program_id(1)
    blk = tl.program_id(2)
    e = tl.load(bexp_ptr + blk)
    if e >= 0:
        rows = tl.load(rows_ptr + blk * BLOCK_M + tl.arange(0, BLOCK_M))     # [BM]
        r_ok = (rows >= 0) & (rows < R)
        rows = tl.where(r_ok, rows, 0)
        rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)      # [BN]
        n_ok = rn < N
        c_lo = 0 if CHUNK_LOOP else tl.program_id(0)
        c_hi = C if CHUNK_LOOP else tl.program_id(0) + 1
        for c in range(c_lo, c_hi):
            lo = tl.load(bounds_ptr + 2 * c)
            hi = tl.load(bounds_ptr + 2 * c + 1)
            if LO_DIV > 1:
                lo = tl.multiple_of(lo, LO_DIV)
            if HI_DIV > 1:
                hi = tl.multiple_of(hi, HI_DIV)
            width = hi - lo
            acc = _chunk_acc(a_ptr, rows, r_ok, A_STRIDE, w_ptr, s_ptr, e, rn, n_ok, N, K, lo, width, alpha, limit,
                             SWIGLU, MXFP4, USE_DOT, PORTABLE, BLOCK_M, BLOCK_N, BLOCK_K, LO_DIV % 32 == 0,
                             FAST_DECODE)   # [BM, BN]
            tl.store(y_ptr + (c * R + rows[:, None]) * N + rn[None, :], acc, mask=r_ok[:, None] & n_ok[None, :])


def clamped_swiglu_triton(gate_up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    gate_up = _check_gate_up(gate_up)
    R, I = gate_up.shape[0], gate_up.shape[1] // 2
    y = torch.empty((R, I), dtype=gate_up.dtype, device=gate_up.device)
    if R and I:
        _swiglu_kernel[(R, triton.cdiv(I, BLOCK_H))](gate_up, y, I, float(alpha), float(limit), BLOCK=BLOCK_H,
                                                         PORTABLE=PORTABLE_MATH, num_warps=4, enable_fp_fusion=True)
    return y


# Integers only (expert ids in, row indices out): nothing it takes changes a float bit, so the row
# count, the experts' offset, the block count and the ids' alignment are not specialized.
@triton.jit(do_not_specialize=["id_ptr", "R", "E_LO", "N_BLOCKS"])
def _group_kernel(id_ptr, rows_ptr, block_ptr, R, E_LO, N_LOCAL, N_BLOCKS, BLOCK_M,
                  R_PAD: tl.constexpr, E_PAD: tl.constexpr, NB_CHUNK: tl.constexpr):
    # group_by_expert's integer recipe in one program (small R): rows_ptr arrives filled with -1
    r = tl.arange(0, R_PAD)
    j = tl.arange(0, E_PAD)
    e = tl.load(id_ptr + r, mask=r < R, other=-1) - E_LO                        # [R_PAD]
    onehot = ((e[:, None] == j[None, :]) & (r < R)[:, None] & (j < N_LOCAL)[None, :]).to(tl.int32)
    count = tl.sum(onehot, axis=0)                                               # [E_PAD]
    blocks = (count + BLOCK_M - 1) // BLOCK_M
    block_end = tl.cumsum(blocks, axis=0)                                        # inclusive
    first_slot = (block_end - blocks) * BLOCK_M
    rank = tl.sum((tl.cumsum(onehot, axis=0) - onehot) * onehot, axis=1)         # [R_PAD]
    local = tl.sum(onehot, axis=1) > 0
    dest = tl.sum(onehot * first_slot[None, :], axis=1) + rank
    tl.store(rows_ptr + dest, r.to(tl.int64), mask=local)
    # a block's owner counts the experts ended before it, NB_CHUNK blocks at a time: one
    # [blocks, E_PAD] tile would spill registers at 128 experts (129 blocks of a decode step)
    for b0 in range(0, N_BLOCKS, NB_CHUNK):
        b = b0 + tl.arange(0, NB_CHUNK)
        owner = tl.sum(((b[:, None] >= block_end[None, :]) & (j < N_LOCAL)[None, :]).to(tl.int32), axis=1)
        tl.store(block_ptr + b, tl.where(owner < N_LOCAL, owner, -1).to(tl.int64), mask=b < N_BLOCKS)


GROUP_KERNEL_MAX = 1 << 15      # R_PAD * E_PAD up to this: one program (a decode step); else torch ops
GROUP_TILE = 1 << 12            # elements of one [NB_CHUNK, E_PAD] step of the block owners


def _group_warps(tile: int) -> int:
    """Warps of _group_kernel for its [R_PAD, E_PAD] tile: 4 to 16, about 32 elements a thread (integers
    only: the warps change no output, only the registers each thread needs)."""
    return max(4, min(16, tile // 1024))


def _group_pad(n: int) -> int:
    """_group_kernel's padding of n rows: 16, 128, 1024, ... (not next_pow2(n): three
    compiles serve every decode and chunk size). Masked lanes add nothing, so no output depends on it."""
    pad = 16
    while pad < n:
        pad *= 8
    return pad


def group_by_expert(flat_ids: torch.Tensor, expert_lo: int, n_local: int,
                    block_m: int = EXPERT_BLOCK_M) -> tuple[torch.Tensor, torch.Tensor]:
    """flat_ids [R] int64 (row r = token r // k, slot r % k) -> (sorted_rows [P], block_expert [P / block_m]).

    Local expert j (id expert_lo + j) owns consecutive blocks of block_m slots holding its rows in
    increasing order, then -1 padding; experts follow each other in id order; ids outside
    [expert_lo, expert_lo + n_local) are skipped. block_expert[b] is the local expert of block b,
    -1 for the unused blocks at the end. P = (cdiv(R, block_m) + n_local) * block_m bounds every
    routing (sum_j cdiv(n_j, block_m) <= cdiv(R, block_m) + n_local), so the shapes depend on R and
    n_local only. Integer torch ops on the ids' device (exact, deterministic); nothing is read on
    the host."""
    _check_ids(flat_ids, n_local, block_m)
    R, dev = flat_ids.shape[0], flat_ids.device
    n_blocks = triton.cdiv(R, block_m) + n_local
    P = n_blocks * block_m
    if R and next_pow2(R) * next_pow2(n_local) <= GROUP_KERNEL_MAX:      # the same integers, 2 launches
        sorted_rows = torch.full((P,), -1, dtype=torch.int64, device=dev)
        block_expert = torch.empty((n_blocks,), dtype=torch.int64, device=dev)
        e_pad = next_pow2(n_local)
        r_pad = min(_group_pad(R), GROUP_KERNEL_MAX // e_pad)
        _group_kernel[(1,)](flat_ids.contiguous(), sorted_rows, block_expert, R, int(expert_lo), n_local, n_blocks,
                            block_m, R_PAD=r_pad, E_PAD=e_pad, NB_CHUNK=max(1, GROUP_TILE // e_pad),
                            num_warps=_group_warps(r_pad * e_pad), enable_fp_fusion=True)
        return sorted_rows, block_expert
    # Larger R: a stable sort by local expert (non-local ids sort last) lists each expert's rows in
    # increasing order; a row's place among its expert's rows is its sorted index minus the index
    # where its expert starts (exact integer ops; one scan over R would cost more than the sort).
    local = (flat_ids >= expert_lo) & (flat_ids < expert_lo + n_local)                  # [R]
    key = torch.where(local, flat_ids - expert_lo, n_local)                             # [R] in [0, n_local]
    sorted_key, order = torch.sort(key, stable=True)                                    # [R], [R] rows
    experts = torch.arange(n_local + 1, dtype=torch.int64, device=dev)
    start = torch.searchsorted(sorted_key, experts)                                     # [E_l + 1] first index
    count = torch.diff(start, append=start.new_full((1,), R))[:n_local]                 # [E_l] rows per expert
    blocks = (count + block_m - 1) // block_m                                           # [E_l]
    block_end = torch.cumsum(blocks, 0)                                                 # [E_l] inclusive
    first_slot = torch.cat([(block_end - blocks) * block_m, block_end.new_full((1,), P)])   # non-local: spare
    dest = first_slot[sorted_key] + torch.arange(R, device=dev) - start[sorted_key]     # [R] distinct
    sorted_rows = torch.full((P + R,), -1, dtype=torch.int64, device=dev)
    sorted_rows.scatter_(0, dest, order)
    block = torch.arange(n_blocks, dtype=torch.int64, device=dev)
    owner = (block[:, None] >= block_end[None, :]).sum(1)                               # [n_blocks]: experts ended before
    block_expert = torch.where(owner < n_local, owner, -1)
    return sorted_rows[:P], block_expert


def launched_blocks(R: int, n_blocks: int, block_m: int) -> int:
    """The blocks a grouped launch of R rows runs programs for: the first min(n_blocks, R // block_m +
    min(R, n_local)) of group_by_expert's n_blocks, which hold every used block. Experts' blocks come
    first, the unused ones (-1) last, and sum_j cdiv(n_j, block_m) <= R // block_m + (experts with
    rows) over any routing. A decode step of 4 rows over 32 experts launches 4 blocks, not 33: its
    other programs only read -1 and returned (a program computes its own tile alone, so which
    programs exist changes no bit). Shapes alone decide (a captured step reads no tensor)."""
    n_local = n_blocks - triton.cdiv(R, block_m)                        # group_by_expert's P / block_m
    return min(n_blocks, R // block_m + min(R, n_local))


def group_by_expert_reference(flat_ids, expert_lo: int, n_local: int, block_m: int = EXPERT_BLOCK_M):
    """group_by_expert in plain Python (lists in, lists out), for the tests."""
    ids = [int(i) for i in flat_ids]
    n_blocks = -(-len(ids) // block_m) + n_local
    sorted_rows, block_expert = [], []
    for j in range(n_local):
        rows = [r for r, e in enumerate(ids) if e == expert_lo + j]
        while rows:
            chunk, rows = rows[:block_m], rows[block_m:]
            sorted_rows += chunk + [-1] * (block_m - len(chunk))
            block_expert.append(j)
    pad = n_blocks - len(block_expert)
    return sorted_rows + [-1] * (pad * block_m), block_expert + [-1] * pad


def expert_gate_up_triton(x: torch.Tensor, k: int, groups, weight, bias: torch.Tensor,
                          fast_decode: bool = True, every_row_local: bool = False) -> torch.Tensor:
    """x [T, H], groups = group_by_expert(ids [T * k]), weight [E_l, N, H] or MXFP4, bias [E_l, N]
    -> h [T * k, N] in x's dtype: h[r] = x[r // k] @ W[e]^T + b[e] for local experts, 0 elsewhere.
    One launch, grid (N tiles, blocks). Each element: linear_triton's reduction of x[r // k] by W[e].
    fast_decode=False: MXFP4 decoded by the exact per-element path everywhere (the same bits; for
    benchmarks and tests, see kernels/matmul.py `_chunk_acc`). every_row_local: the caller's promise
    that every id is a local expert (one device holding them all), so every row is stored and none
    is filled with 0 first (a 2048-token prefill's h is 94 MB a layer)."""
    check_float("x", x, 2)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"expert_gate_up: k must be a positive int, got {k!r}")
    T, H = x.shape
    R = T * k
    sorted_rows, block_expert, block_m = _check_groups(groups, R, x.device)
    w, s, E_l, N = _check_expert_weight("gate_up weight", weight, H, x, _n_local(block_expert, R, block_m))
    if not isinstance(bias, torch.Tensor) or bias.shape != (E_l, N) or not bias.is_floating_point() \
            or bias.device != x.device:
        raise ValueError(f"expert_gate_up: bias must be a float [{E_l}, {N}] tensor on {x.device}, got "
                         f"{tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__}")
    h = (torch.empty if every_row_local else torch.zeros)((R, N), dtype=x.dtype, device=x.device)
    if R == 0 or N == 0:
        return h
    bn, bk, warps, stages = expert_tiles("gate_up", N, H, x.dtype, s is not w, block_m)
    grid = (triton.cdiv(N, bn), launched_blocks(R, block_expert.shape[0], block_m))
    mxfp4 = {"FAST_DECODE": fast_decode} if s is not w else {}
    _grouped_gate_up_kernel[grid](x.contiguous(), sorted_rows, block_expert, w, s, bias.contiguous(), h, R, N, H, k,
                                  MXFP4=s is not w, USE_DOT=USE_DOT, BLOCK_M=block_m, BLOCK_N=bn,
                                  BLOCK_K=bk, num_warps=warps, num_stages=stages, enable_fp_fusion=True, **mxfp4)
    return h


# The down projection's K chunks: one program per (chunk, N tile, block), the default, or
# (expert_down_partials_triton(..., chunk_loop=True)) one program per (N tile, block) that computes
# the chunks in turn. The same bits either way. (One program walking all the chunks in one K loop,
# the accumulator reset at each chunk's start, also gave the same bits on an H200 but took 1.7-2.4x
# the time of a program per chunk at 1, 32 and 2048 tokens, bf16 and MXFP4: not kept.)
def expert_down_partials_triton(a: torch.Tensor, groups, weight, bounds,
                                prologue_swiglu: tuple[float, float] | None = None,
                                chunk_loop: bool = False, fast_decode: bool = True,
                                every_row_local: bool = False) -> torch.Tensor:
    """a [R, K] (or the gate_up h [R, 2K] with prologue_swiglu = (alpha, limit)), groups as above,
    weight [E_l, N, K] or MXFP4, bounds C column ranges (lo, hi) of K -> parts [C, R, N] fp32, no
    bias; rows of non-local experts stay 0. One launch, grid (C, N tiles, blocks). Each element:
    linear_triton's reduction of the chunk's fresh copy (see kernels/matmul.py linear_chunks).
    fast_decode, every_row_local: as in expert_gate_up_triton (a prefill's parts: 755 MB a layer)."""
    check_float("a", a, 2)
    R = a.shape[0]
    x_per_k = 1 if prologue_swiglu is None else 2
    if a.shape[1] % x_per_k:
        raise ValueError(f"expert_down_partials: the SwiGLU prologue needs an even width, got {tuple(a.shape)}")
    K = a.shape[1] // x_per_k
    sorted_rows, block_expert, block_m = _check_groups(groups, R, a.device)
    w, s, E_l, N = _check_expert_weight("down weight", weight, K, a, _n_local(block_expert, R, block_m))
    bounds = list(bounds)
    b = bounds_tensor(bounds, K, a.device)                               # [C, 2]
    alpha, limit = prologue_swiglu if prologue_swiglu is not None else (0.0, 0.0)
    parts = (torch.empty if every_row_local else torch.zeros)((b.shape[0], R, N), dtype=torch.float32,
                                                              device=a.device)
    if R == 0 or N == 0 or b.shape[0] == 0:
        return parts
    bn, bk, warps, stages = expert_tiles("down", N, K, a.dtype, s is not w, block_m)
    C = b.shape[0]
    grid = (1 if chunk_loop else C, triton.cdiv(N, bn), launched_blocks(R, block_expert.shape[0], block_m))
    hints = down_hints(bounds, s is not w) | ({"FAST_DECODE": fast_decode} if s is not w else {})
    _grouped_down_kernel[grid](a.contiguous(), sorted_rows, block_expert, w, s, b, parts, R, N, K, x_per_k * K, C,
                               float(alpha), float(limit), SWIGLU=prologue_swiglu is not None, MXFP4=s is not w,
                               USE_DOT=USE_DOT, PORTABLE=PORTABLE_MATH, CHUNK_LOOP=chunk_loop,
                               BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages,
                               enable_fp_fusion=True, **hints)
    return parts


def down_hints(bounds, mxfp4: bool) -> dict:
    """The down kernel's alignment hints for these bounds: dense, both ends of every chunk
    (kernels.matmul bounds_div: vector loads); MXFP4, the first column only (_lo_div), as its bits
    were recorded."""
    if mxfp4:
        return {"LO_DIV": _lo_div(bounds)}
    div = bounds_div(bounds)
    return {"LO_DIV": div, "HI_DIV": div}


def clamped_swiglu_portable(gate_up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """The bit-exact reference: gate_up [..., 2I], interleaved (gate = even columns, up = odd) ->
    [..., I] in gate_up's dtype: (gate * sigmoid(alpha * gate)) * (up + 1) in fp32, the sigmoid
    portable (float64, rounded once), the result rounded once. The torch ops' experts run it, the
    Triton kernel (and the down kernel's SwiGLU prologue) give its bits in the interpreter, and the
    swiglu kernel specs compare against it."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"clamped_swiglu: gate_up width {gate_up.shape[-1]} is odd")
    x = gate_up.to(torch.float32)
    gate = x[..., 0::2].clamp(max=limit)
    up = x[..., 1::2].clamp(min=-limit, max=limit)
    y = torch.mul(torch.mul(gate, portable.sigmoid(torch.mul(gate, alpha))), torch.add(up, 1.0))
    return y.to(gate_up.dtype)


def _check_gate_up(gate_up):
    check_float("gate_up", gate_up, 2)
    if gate_up.shape[1] % 2:
        raise ValueError(f"clamped_swiglu: gate_up width {gate_up.shape[1]} is odd")
    return gate_up.contiguous()


def _check_ids(flat_ids, n_local, block_m):
    if not isinstance(flat_ids, torch.Tensor) or flat_ids.dtype != torch.int64 or flat_ids.dim() != 1:
        got = f"{flat_ids.dtype} {tuple(flat_ids.shape)}" if isinstance(flat_ids, torch.Tensor) else type(flat_ids).__name__
        raise ValueError(f"group_by_expert: flat_ids must be a 1-D int64 tensor, got {got}")
    for name, v in (("n_local", n_local), ("block_m", block_m)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"group_by_expert: {name} must be a positive int, got {v!r}")


def _check_groups(groups, R: int, device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """groups = group_by_expert(...) for R rows -> (sorted_rows, block_expert, block_m): the rows
    per block read off the shapes (P = n_blocks * block_m), one of EXPERT_BLOCK_SIZES."""
    try:
        sorted_rows, block_expert = groups
    except (TypeError, ValueError):
        raise ValueError("groups must be the (sorted_rows, block_expert) pair of group_by_expert") from None
    for name, t in (("sorted_rows", sorted_rows), ("block_expert", block_expert)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.dim() != 1 or t.device != device:
            raise ValueError(f"groups: {name} must be a 1-D int64 tensor on {device}")
    P, n_blocks = sorted_rows.shape[0], block_expert.shape[0]
    block_m = P // n_blocks if n_blocks else 0
    if block_m not in EXPERT_BLOCK_SIZES or P != n_blocks * block_m or n_blocks <= triton.cdiv(R, block_m):
        raise ValueError(f"groups: {P} rows in {n_blocks} blocks are not group_by_expert of {R} rows with "
                         f"block_m in {EXPERT_BLOCK_SIZES}")
    return sorted_rows.contiguous(), block_expert.contiguous(), block_m


def _n_local(block_expert: torch.Tensor, R: int, block_m: int) -> int:
    return block_expert.shape[0] - triton.cdiv(R, block_m)        # P / block_m = cdiv(R, bm) + n_local


def _check_expert_weight(name, weight, K: int, x: torch.Tensor, n_local: int):
    """Dense [E_l, N, K] in x's dtype, or MXFP4 (blocks [E_l, N, K/32, 16] u8, scales [E_l, N, K/32] u8)
    -> (w, s, E_l, N); s is w for a dense weight."""
    if isinstance(weight, tuple):
        if len(weight) != 2:
            raise ValueError(f"{name}: MXFP4 weights are a (blocks, scales) pair, got {len(weight)} items")
        blocks, scales = weight
        if not all(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.device == x.device for t in weight):
            raise ValueError(f"{name}: MXFP4 blocks and scales must be uint8 tensors on {x.device}")
        if blocks.dim() != 4 or blocks.shape[-1] != 16 or scales.shape != blocks.shape[:3] or 32 * blocks.shape[2] != K:
            raise ValueError(f"{name}: MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not "
                             f"fit [E, N, {K}/32, 16] and [E, N, {K}/32]")
        if x.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"{name}: MXFP4 decodes to float32 or bfloat16 activations, got {x.dtype}")
        w, s = blocks.contiguous(), scales.contiguous()
    else:
        check_float(name, weight, 3)
        if weight.shape[2] != K or weight.dtype != x.dtype or weight.device != x.device:
            raise ValueError(f"{name} {tuple(weight.shape)} ({weight.dtype}, {weight.device}) does not fit "
                             f"[E, N, {K}] in {x.dtype} on {x.device}")
        w = s = weight.contiguous()
    if w.shape[0] != n_local:
        raise ValueError(f"{name}: {w.shape[0]} experts, but the groups were made for {n_local}")
    return w, s, w.shape[0], w.shape[1]


# --------------------------------------------------------------------------- the kernel specs' cases
def _router_op(logits, k):
    return router_top_k_triton(logits, k)


def _swiglu_op(gate_up):
    return clamped_swiglu_triton(gate_up)


def _router_inputs(inp, s, d):
    logits = d.normal(s["T"], s["E"], scale=4 * inp["scale"], dtype=torch.float32)
    if inp["ties"]:
        logits = logits.round().clamp(-inp["ties"], inp["ties"])
    return {"logits": logits.to(d.dtype), "k": s["k"]}


def _top_k_rows(w, ids):
    return torch.cat([w.to(torch.float64), ids.to(torch.float64)], dim=1)   # [T, 2k]


CASES = (
    KernelCase(name="router_top_k", dims=("T", "E", "k"), inputs=_router_inputs, op=_router_op, options=("ties",),
               call=lambda op, x, r, offered: _top_k_rows(*op(x["logits"][r], x["k"])),
               reference=lambda x: _top_k_rows(*router_top_k_portable(x["logits"], x["k"])),
               elements=lambda s: 2 * s["T"] * s["E"] + 4 * s["T"] * s["k"],
               problems=lambda inp, s: [(("shape", "k"), f"k = {s['k']} exceeds E = {s['E']}")] if s["k"] > s["E"]
               else [], note="lockstep.kernels.moe.router_top_k_triton"),
    KernelCase(name="swiglu", dims=("M", "I"), op=_swiglu_op,
               inputs=lambda inp, s, d: {"x": d.normal(s["M"], 2 * s["I"], scale=8 * inp["scale"])},
               call=lambda op, x, r, offered: op(x["x"][r]), reference=lambda x: clamped_swiglu_portable(x["x"]),
               elements=lambda s: 5 * s["M"] * s["I"], note="lockstep.kernels.moe.clamped_swiglu_triton"),
)
