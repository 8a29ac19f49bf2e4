"""Grouped experts (kernels.moe): group_by_expert, expert_gate_up_triton, expert_down_partials_triton
and engine.experts (experts_grouped, experts_per_expert).

Bitwise: the grouped launches give the bits of the per-expert path they replaced (for each expert,
linear_triton on its rows; per fixed K chunk a fresh copy, clamped_swiglu_triton, linear_triton),
packed MXFP4 gives the bits of its dequantized dense weight, and a row's outputs do not depend
on the batch or the experts around it. Grouping: equal to a plain-Python reference."""

import pytest
import torch

from lockstep.engine.experts import LocalExperts, experts_grouped, experts_one_device, experts_per_expert
from lockstep.engine.linear import k_chunk_bounds
from lockstep.engine.mxfp4 import dequantize, quantize
from lockstep.kernels.matmul import linear_triton
from lockstep.kernels.moe import (EXPERT_BLOCK_M, clamped_swiglu_triton, expert_down_partials_triton, expert_gate_up_triton,
                         group_by_expert, group_by_expert_reference, launched_blocks)
from tests.kernels.conftest import DEVICE

ALPHA, LIMIT = 1.702, 7.0
SWIGLU = (ALPHA, LIMIT)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, except that any NaN equals any NaN (MXFP4 scale 255 is 'NaN', payload unsaid)."""
    nan = torch.isnan(a)
    return nan.equal(torch.isnan(b)) and bits(a)[~nan].equal(bits(b)[~nan])


def experts(E, H, I, dtype, seed, scale=1.0):
    """gate_up_w [E, 2I, H], gate_up_b [E, 2I], down_w [E, H, I] on DEVICE (made on the CPU)."""
    g = torch.Generator().manual_seed(seed)
    gu_w = (torch.randn(E, 2 * I, H, generator=g) * scale / H ** 0.5).to(dtype)
    gu_b = torch.randn(E, 2 * I, generator=g).to(dtype)
    dn_w = (torch.randn(E, H, I, generator=g) / I ** 0.5).to(dtype)
    return gu_w.to(DEVICE), gu_b.to(DEVICE), dn_w.to(DEVICE)


def tokens(T, H, k, E_ids, dtype, seed, lo=0):
    """x [T, H] and ids [T, k] in [lo, lo + E_ids), distinct per token (as top-k gives)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype)
    ids = torch.stack([torch.randperm(E_ids, generator=g)[:k] for _ in range(T)]) + lo
    return x.to(DEVICE), ids.to(DEVICE)


def per_expert_path(x, ids, gu_w, gu_b, dn_w, bounds, expert_lo=0):
    """The engine's Triton experts before grouping (GptOssModel._experts_by_group, engine/parallel.py):
    -> h [R, 2I] and parts [C, R, H], non-local rows 0."""
    T, k = ids.shape
    flat = ids.reshape(-1)
    h = torch.zeros((T * k, gu_w.shape[1]), dtype=x.dtype, device=x.device)
    parts = torch.zeros((len(bounds), T * k, dn_w.shape[1]), dtype=x.dtype, device=x.device)
    for e in range(gu_w.shape[0]):
        rows = (flat == e + expert_lo).nonzero()[:, 0]
        if rows.numel() == 0:
            continue
        he = linear_triton(x[rows // k], gu_w[e], gu_b[e])
        h[rows] = he
        for c, (lo, hi) in enumerate(bounds):
            a = clamped_swiglu_triton(he[:, 2 * lo:2 * hi].clone(), ALPHA, LIMIT)
            parts[c, rows] = linear_triton(a, dn_w[e][:, lo:hi].clone())
    return h, parts


# ------------------------------------------------------------------ group_by_expert
@pytest.mark.parametrize("R, lo, n_local, block_m, E_ids", [
    (1, 0, 4, 16, 4),          # one row
    (0, 0, 3, 16, 3),          # no rows: only unused blocks
    (40, 0, 8, 16, 4),         # experts 4..7 empty
    (40, 4, 4, 16, 12),        # an EP slice: ids outside [4, 8) skipped
    (37, 2, 3, 4, 8),          # several blocks per expert, a partial last block
    (9, 0, 2, 1, 2),           # block_m 1: no padding at all
    (64, 0, 1, 16, 1),         # every row one expert, whole blocks
    (200, 0, 32, 16, 32),      # the kernel padded to 1,024 rows and 128 blocks (past next_pow2)
    (200, 0, 128, 16, 128),    # 1,024 rows would pass GROUP_KERNEL_MAX at 128 experts: 256
    (5000, 0, 8, 16, 8),       # past GROUP_KERNEL_MAX: the sort path (a prefill)
    (3001, 8, 8, 64, 24),      # the sort path on an EP slice, ids on both sides skipped
])
def test_group_by_expert_matches_the_reference(R, lo, n_local, block_m, E_ids):
    g = torch.Generator().manual_seed(R * 31 + lo)
    ids = torch.randint(0, E_ids, (R,), generator=g)
    sorted_rows, block_expert = group_by_expert(ids.to(DEVICE), lo, n_local, block_m)
    ref_rows, ref_blocks = group_by_expert_reference(ids.tolist(), lo, n_local, block_m)
    P = (-(-R // block_m) + n_local) * block_m
    assert sorted_rows.shape == (P,) and block_expert.shape == (P // block_m,)
    assert sorted_rows.device.type == DEVICE.type and sorted_rows.dtype == block_expert.dtype == torch.int64
    assert sorted_rows.tolist() == ref_rows and block_expert.tolist() == ref_blocks
    local = [r for r, e in enumerate(ids.tolist()) if lo <= e < lo + n_local]
    assert sorted(r for r in ref_rows if r >= 0) == local              # every local row exactly once
    if R:                                       # the launches' programs reach every used block
        assert set(ref_blocks[launched_blocks(R, len(ref_blocks), block_m):]) <= {-1}


def test_group_by_expert_worst_case_fills_p():
    """Every expert one row past a whole block: the most blocks a routing can need still fit P."""
    n_local, bm = 3, 4
    ids = torch.tensor([e for e in range(n_local) for _ in range(bm + 1)])
    sorted_rows, block_expert = group_by_expert(ids.to(DEVICE), 0, n_local, bm)
    assert block_expert.tolist() == [0, 0, 1, 1, 2, 2, -1]
    assert launched_blocks(ids.numel(), 7, bm) == 6                     # the bound is tight here
    assert sorted_rows.tolist() == group_by_expert_reference(ids.tolist(), 0, n_local, bm)[0]


@pytest.mark.parametrize("ids, n_local, block_m, match", [
    (torch.zeros(4, dtype=torch.int32), 2, 16, "int64"),
    (torch.zeros(2, 2, dtype=torch.int64), 2, 16, "1-D"),
    ([0, 1], 2, 16, "1-D int64 tensor"),
    (torch.zeros(4, dtype=torch.int64), 0, 16, "n_local"),
    (torch.zeros(4, dtype=torch.int64), 2, 0, "block_m"),
    (torch.zeros(4, dtype=torch.int64), 2.0, 16, "n_local"),
])
def test_group_by_expert_refuses_bad_input(ids, n_local, block_m, match):
    with pytest.raises(ValueError, match=match):
        group_by_expert(ids, 0, n_local, block_m)


# ------------------------------------------------------------------ bits of the per-expert path
@pytest.mark.parametrize("T, k, E, H, I, expert_lo, E_ids", [
    (7, 3, 5, 130, 100, 0, 5),       # one device: every expert local; chunks 12-13 wide
    (6, 2, 4, 96, 60, 2, 8),         # an EP slice: experts 2..5 local, the rest skipped
    (1, 4, 6, 100, 36, 0, 6),        # a decode step of one token
])
def test_grouped_equals_the_per_expert_path(T, k, E, H, I, expert_lo, E_ids):
    gu_w, gu_b, dn_w = experts(E, H, I, torch.float32, seed=T + E, scale=3.0)
    x, ids = tokens(T, H, k, E_ids, torch.float32, seed=T)
    bounds = k_chunk_bounds(I)
    h_ref, parts_ref = per_expert_path(x, ids, gu_w, gu_b, dn_w, bounds, expert_lo)
    groups = group_by_expert(ids.reshape(-1), expert_lo, E, EXPERT_BLOCK_M)
    h = expert_gate_up_triton(x, k, groups, gu_w, gu_b)
    assert bits(h).equal(bits(h_ref))
    a = clamped_swiglu_triton(h, ALPHA, LIMIT)
    assert bits(expert_down_partials_triton(a, groups, dn_w, bounds)).equal(bits(parts_ref))
    assert bits(expert_down_partials_triton(h, groups, dn_w, bounds, SWIGLU)).equal(bits(parts_ref))   # fused
    held = LocalExperts(gu_w.cpu(), gu_b.cpu(), dn_w.cpu(), tuple(bounds), expert_lo, E, ALPHA, LIMIT)
    torch_parts = experts_per_expert(x.cpu(), ids.cpu(), held)          # the torch ops' experts (values)
    torch.testing.assert_close(parts_ref.cpu(), torch_parts, rtol=0, atol=1e-4)


@pytest.mark.parametrize("fused", [False, True])
def test_expert_partials_tp_slice_equals_the_per_expert_path(fused):
    """lockstep.engine.experts' grouped and per-expert implementations on a TP rank's intermediate range
    (gate_up columns and down K chunks [lo, hi) of I, bounds relative to it) and an EP slice, both
    row layouts; the SwiGLU in its own launch or fused into the down kernel."""
    E, H, I, k = 4, 96, 80, 2
    gu_w, gu_b, dn_w = experts(E, H, I, torch.float32, seed=11, scale=3.0)
    x, ids = tokens(9, H, k, 8, torch.float32, seed=12)
    chunks = k_chunk_bounds(I)[2:4]                                    # rank 1 of tp = 4
    i_lo, i_hi = chunks[0][0], chunks[-1][1]
    local = [(a - i_lo, b - i_lo) for a, b in chunks]
    gu_w, gu_b, dn_w = gu_w[:, 2 * i_lo:2 * i_hi].contiguous(), gu_b[:, 2 * i_lo:2 * i_hi].contiguous(), \
        dn_w[:, :, i_lo:i_hi].contiguous()
    _, parts_ref = per_expert_path(x, ids, gu_w, gu_b, dn_w, local, expert_lo=4)
    parts = experts_grouped(x, ids, LocalExperts(gu_w, gu_b, dn_w, tuple(local), 4, E, ALPHA, LIMIT),
                            fused_swiglu=fused)
    assert parts.shape == (2, 9 * k, H) and bits(parts).equal(bits(parts_ref))
    torch_parts = experts_per_expert(x.cpu(), ids.cpu(),
                                     LocalExperts(gu_w.cpu(), gu_b.cpu(), dn_w.cpu(), tuple(local), 4, E, ALPHA, LIMIT))
    torch.testing.assert_close(parts.cpu(), torch_parts, rtol=0, atol=1e-4)
    assert (torch_parts[:, ids.reshape(-1).cpu() < 4] == 0).all() and (parts[:, ids.reshape(-1) < 4] == 0).all()


@pytest.mark.parametrize("fused", [False, True])
def test_one_device_path_stores_every_row_with_the_grouped_bits(fused, request):
    """experts_one_device (the Triton ops' experts) allocates h and the partials unfilled: poisoned
    with NaN there, every row still comes back with experts_grouped's bits (a row of a block tail,
    of an expert with rows in several blocks); and it refuses a slice that is not every expert."""
    E, H, I, k = 5, 96, 60, 3
    gu_w, gu_b, dn_w = experts(E, H, I, torch.float32, seed=21, scale=3.0)
    x, ids = tokens(23, H, k, E, torch.float32, seed=22)
    bounds = k_chunk_bounds(I)
    held = LocalExperts(gu_w, gu_b, dn_w, tuple(bounds), 0, E, ALPHA, LIMIT)
    ref = experts_grouped(x, ids, held, fused_swiglu=fused)
    request.getfixturevalue("nan_empty")                              # from here on
    parts = experts_grouped(x, ids, held, fused_swiglu=fused, every_expert_local=True)
    assert not parts.isnan().any() and bits(parts).equal(bits(ref))
    if not fused:
        assert bits(experts_one_device(x, ids, held)).equal(bits(ref))
    with pytest.raises(ValueError, match="expert_lo 0"):
        experts_grouped(x, ids, LocalExperts(gu_w, gu_b, dn_w, tuple(bounds), 1, E - 1, ALPHA, LIMIT),
                        every_expert_local=True)


# ------------------------------------------------------------------ MXFP4 packed weights
def mxfp4_experts(E, N, K, seed):
    """(blocks, scales) of random codes with the scale edges planted in some blocks: 0 (subnormal
    values), 1, 127, 254 (+-inf for |code| >= 2), 255 (NaN)."""
    g = torch.Generator().manual_seed(seed)
    blocks, scales = quantize(torch.randn(E, N, K, generator=g))
    blocks = torch.randint(0, 256, blocks.shape, generator=g, dtype=torch.int64).to(torch.uint8)
    edge = torch.tensor([0, 1, 127, 254, 255, 0], dtype=torch.uint8)
    scales[0, :6, 0] = edge
    scales[-1, -1, -1] = 0
    return blocks.to(DEVICE), scales.to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mxfp4_packed_equals_its_dequantized_dense_weight(dtype):
    """Decoding in the kernel (k -> byte (k // 32, (k % 32) // 2), nibble k % 2) gives exactly
    engine.mxfp4.dequantize: the outputs are bitwise those of the dense weight. Down chunks of
    I = 96 are 12 wide, so chunks start and end inside MXFP4 blocks.

    Except compiled at bf16: there the decoded tile holds the same bits (tests/kernels/
    test_mxfp4_tile.py), but the H200 (Triton 3.6) run of this test and of bench/moe.py found the
    tl.dot outputs off by an ulp now and then: a bf16 dot whose weight operand is computed in
    registers is not compiled to the same instruction sequence as one that loads it. So there the
    packed path is its own reduction (its goldens are recorded from it, run to run and batch to
    batch invariant like any other), and this test holds it to the dense values within 1e-2."""
    E, H, I, k = 4, 160, 96, 2
    gu_blocks = mxfp4_experts(E, 2 * I, H, seed=21)
    dn_blocks = mxfp4_experts(E, H, I, seed=22)
    gu_b = torch.randn(E, 2 * I, generator=torch.Generator().manual_seed(23)).to(dtype).to(DEVICE)
    x, ids = tokens(5, H, k, E, dtype, seed=24)
    x = x / 64                                              # keep scale-127 values finite through two layers
    groups = group_by_expert(ids.reshape(-1), 0, E, EXPERT_BLOCK_M)
    exact = dtype == torch.float32 or DEVICE.type == "cpu"

    def same(a, b):
        if exact:
            return same_bits(a, b)
        return torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-2, equal_nan=True)
    h_packed = expert_gate_up_triton(x, k, groups, gu_blocks, gu_b)
    h_dense = expert_gate_up_triton(x, k, groups, dequantize(*gu_blocks, dtype=dtype), gu_b)
    assert same(h_packed, h_dense)
    a = clamped_swiglu_triton(h_dense, ALPHA, LIMIT)
    bounds = k_chunk_bounds(I)
    p_packed = expert_down_partials_triton(a, groups, dn_blocks, bounds)
    assert same(p_packed, expert_down_partials_triton(a, groups, dequantize(*dn_blocks, dtype=dtype), bounds))
    assert torch.isfinite(p_packed).any()


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 40])
def test_the_swiglu_inside_the_down_kernel_has_its_own_launchs_bits(packed, dtype, T):
    """experts_grouped(fused_swiglu=True) runs the clamped SwiGLU inside the down kernel's loads:
    the bits of the SwiGLU in its own launch (the CUDA goldens were recorded so), dense and packed,
    at decode and prefill row counts, clamped values included; on a GPU, compiled too."""
    E, H, I, k = 8, 160, 96, 4
    if packed:
        g = torch.Generator().manual_seed(51)
        gu_w = tuple(t.to(DEVICE) for t in quantize(torch.randn(E, 2 * I, H, generator=g) * 3 / H ** 0.5))
        dn_w = tuple(t.to(DEVICE) for t in quantize(torch.randn(E, H, I, generator=g) / I ** 0.5))
        gu_b = torch.randn(E, 2 * I, generator=g).to(dtype).to(DEVICE)
    else:
        gu_w, gu_b, dn_w = experts(E, H, I, dtype, seed=52, scale=3.0)
    x, ids = tokens(T, H, k, E, dtype, seed=53)
    held = LocalExperts(gu_w, gu_b, dn_w, tuple(k_chunk_bounds(I)), 0, E, ALPHA, LIMIT)
    h = expert_gate_up_triton(x, k, group_by_expert(ids.reshape(-1), 0, E, EXPERT_BLOCK_M), gu_w, gu_b)
    assert (h.float().abs() > LIMIT).any()                            # the clamp is reached
    separate = experts_grouped(x, ids, held, every_expert_local=True)
    assert same_bits(experts_grouped(x, ids, held, fused_swiglu=True, every_expert_local=True), separate)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T", [1, 5, 40])
def test_mxfp4_fast_decode_has_the_exact_decodes_bits(dtype, T):
    """The fast MXFP4 decode (kernels/matmul.py `_mxfp4_tile_fast`, taken by every program whose
    scales lie in MXFP4_FAST_SCALES and whose chunk bounds are even) gives the bits of the exact
    per-element decode everywhere (fast_decode=False, the kernels before it), compiled too: the
    same tile values, so the same products in the same order. Edge scales (0, 1, 254, 255) send
    their programs down the exact path; chunks start mid-group (12 wide), at scale-group starts
    (ALIGNED), and at odd columns (the exact path)."""
    E, H, I, k = 4, 160, 96, 2
    gu_w, dn_w = mxfp4_experts(E, 2 * I, H, seed=41), mxfp4_experts(E, H, I, seed=42)
    for scales, (e, n, g), edge in ((gu_w[1], (1, 100, 2), 253), (gu_w[1], (2, 150, 4), 254),
                                    (gu_w[1], (3, 40, 0), 1), (dn_w[1], (1, 70, 1), 253), (dn_w[1], (2, 20, 2), 254)):
        scales[e, n, g] = edge                   # alone in their programs: just outside the fast range
    gu_b = torch.randn(E, 2 * I, generator=torch.Generator().manual_seed(43)).to(dtype).to(DEVICE)
    x, ids = tokens(T, H, k, E, dtype, seed=44)
    x = x / 64
    groups = group_by_expert(ids.reshape(-1), 0, E, EXPERT_BLOCK_M)
    h = expert_gate_up_triton(x, k, groups, gu_w, gu_b)
    assert same_bits(h, expert_gate_up_triton(x, k, groups, gu_w, gu_b, fast_decode=False))
    a = clamped_swiglu_triton(torch.nan_to_num(h), ALPHA, LIMIT)
    for bounds in (k_chunk_bounds(I), [(0, 32), (32, 96)], [(0, 33), (33, 96)], [(2, 50), (50, 94)]):
        fast = expert_down_partials_triton(a, groups, dn_w, bounds)
        assert same_bits(fast, expert_down_partials_triton(a, groups, dn_w, bounds, fast_decode=False)), bounds
    assert torch.isfinite(h).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_nan_group_past_a_chunks_end_stays_out_of_its_partial(dtype):
    """Ordinary scales (the fast decode runs) but one scale group of 255 (NaN) wholly past the first
    chunk's end, yet inside its last 64-column tile: that chunk's partials stay finite, as the exact
    decode has them (a compiled bf16 decode once multiplied the tile's +0 codes past the end by the
    group's inf power: NaN), and the next chunk, which holds the group, is NaN."""
    E, H, I, k = 2, 32, 128, 1
    dn_blocks, dn_scales = mxfp4_experts(E, H, I, seed=45)
    dn_scales.fill_(127)
    dn_scales[:, :, 1] = 255                                            # columns 32-63
    x, ids = tokens(3, I, k, E, dtype, seed=46)
    groups = group_by_expert(ids.reshape(-1), 0, E, EXPERT_BLOCK_M)
    bounds = [(0, 24), (24, 128)]                                       # the first chunk's tile: 0-63
    fast = expert_down_partials_triton(x / 64, groups, (dn_blocks, dn_scales), bounds)
    exact = expert_down_partials_triton(x / 64, groups, (dn_blocks, dn_scales), bounds, fast_decode=False)
    assert same_bits(fast, exact) and torch.isfinite(fast[0]).all() and torch.isnan(fast[1]).all()


def test_mxfp4_scale_255_is_nan_and_the_edges_are_exact():
    """One weight row per case: x = e_j picks column j, so h = W[:, j] exactly (+ zero bias): the
    kernel's decoded values, compared with dequantize bit for bit, NaN block included."""
    K, N = 64, 6
    blocks = torch.randint(0, 256, (1, N, K // 32, 16), generator=torch.Generator().manual_seed(31),
                           dtype=torch.int64).to(torch.uint8)
    scales = torch.tensor([[[0, 1]], [[127, 254]], [[255, 126]], [[200, 0]], [[3, 128]], [[50, 60]]],
                          dtype=torch.uint8).reshape(1, N, K // 32)
    dense = dequantize(blocks, scales)                                  # [1, N, K]
    x = torch.eye(K)                                                    # token j selects column j
    ids = torch.zeros(K, 1, dtype=torch.int64)
    w = (blocks.to(DEVICE), scales.to(DEVICE))
    groups = group_by_expert(ids.reshape(-1).to(DEVICE), 0, 1, EXPERT_BLOCK_M)
    h = expert_gate_up_triton(x.to(DEVICE), 1, groups, w, torch.zeros(1, N, device=DEVICE)).cpu()   # [K, N]
    want = dense[0].T                                                   # [K, N]
    finite = torch.isfinite(want).all(0)                                # rows whose other columns are finite
    assert bits(h[:, finite]).equal(bits(want[:, finite] + 0.0))
    assert torch.isnan(h[:, 2]).all()                                   # scale 255: NaN block (0 * NaN)


# ------------------------------------------------------------------ batch invariance
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_token_does_not_depend_on_its_batch(dtype):
    """A token alone == the same token (same experts) inside batches of 2, 3, 17 and 64 tokens at
    every position, bitwise: gate_up rows and every down partial. Other tokens are random and use
    other experts; every token of a batch is drawn from a pool computed alone."""
    E, H, I, k = 6, 96, 40, 3
    gu_w, gu_b, dn_w = experts(E, H, I, dtype, seed=41, scale=3.0)
    pool, pool_ids = tokens(8, H, k, E, dtype, seed=42)
    bounds = [(0, 13), (13, 40)]

    def run(x, ids):
        groups = group_by_expert(ids.reshape(-1), 0, E, EXPERT_BLOCK_M)
        h = expert_gate_up_triton(x, k, groups, gu_w, gu_b)
        return h, expert_down_partials_triton(h, groups, dn_w, bounds, SWIGLU)

    alone = [run(pool[i:i + 1], pool_ids[i:i + 1]) for i in range(len(pool))]
    g = torch.Generator().manual_seed(43)
    for T in (2, 3, 17, 64):
        pick = torch.randint(0, len(pool), (T,), generator=g)
        pick[0], pick[-1] = 0, 1
        h, parts = run(pool[pick.to(DEVICE)], pool_ids[pick.to(DEVICE)])
        for t in range(T):
            h1, p1 = alone[pick[t]]
            assert bits(h[t * k:(t + 1) * k]).equal(bits(h1)), (T, t)
            assert bits(parts[:, t * k:(t + 1) * k]).equal(bits(p1)), (T, t)


# ------------------------------------------------------------------ bad input
def _bad_cases():
    E, H, I, k = 2, 32, 32, 2
    gu_w, gu_b, dn_w = experts(E, H, I, torch.float32, seed=51)
    x, ids = tokens(3, H, k, E, torch.float32, seed=52)
    groups = group_by_expert(ids.reshape(-1), 0, E, EXPERT_BLOCK_M)
    other = group_by_expert(ids.reshape(-1), 0, E, EXPERT_BLOCK_M // 2)     # another block size
    three = group_by_expert(ids.reshape(-1), 0, 3, EXPERT_BLOCK_M)
    a = torch.zeros(6, I, device=DEVICE)
    u8 = lambda *s: torch.zeros(*s, dtype=torch.uint8, device=DEVICE)   # noqa: E731
    gate_up = lambda *args: lambda: expert_gate_up_triton(*args)      # noqa: E731
    down = lambda *args: lambda: expert_down_partials_triton(*args)   # noqa: E731
    return [
        (gate_up(x, k, groups, gu_w.to(torch.bfloat16), gu_b), "does not fit"),
        (gate_up(x, k, groups, gu_w[:, :, :-1], gu_b), "does not fit"),
        (gate_up(x, k, groups, gu_w, gu_b[:, :-1]), "bias"),
        (gate_up(x, 0, groups, gu_w, gu_b), "k must be"),
        (gate_up(x, k, other, gu_w, gu_b), "not group_by_expert"),
        (gate_up(x, k, three, gu_w, gu_b), "made for 3"),
        (gate_up(x, k, (groups[0].to(torch.int32), groups[1]), gu_w, gu_b), "int64"),
        (gate_up(x, k, groups[0], gu_w, gu_b), "pair"),
        (gate_up(x, k, groups, (u8(E, 2 * I, 1, 16), u8(E, 2 * I, 2)), gu_b), "MXFP4"),
        (gate_up(x, k, groups, (u8(E, 2 * I, 1, 16).float(), u8(E, 2 * I, 1)), gu_b), "uint8"),
        (gate_up(x, k, groups, (u8(E, 2 * I, 1, 16),), gu_b), "pair"),
        (gate_up(x.to(torch.int64), k, groups, gu_w, gu_b), "float32"),
        (down(a, groups, dn_w, [(0, I + 1)]), "0 <= lo <= hi"),
        (down(a, groups, dn_w, [(3, 2)]), "0 <= lo <= hi"),
        (down(a, groups, dn_w, [(0, 1.5)]), "pair of ints"),
        (down(a[:, :-1], groups, dn_w, [(0, 8)], SWIGLU), "even width"),
        (down(a, groups, dn_w, [(0, 8)], SWIGLU), "does not fit"),        # the prologue halves the width
        (down(torch.zeros(40, I, device=DEVICE), groups, dn_w, [(0, 8)]), "not group_by_expert"),
    ]


@pytest.mark.parametrize("case", range(18))
def test_bad_input_is_refused(case):
    call, match = _bad_cases()[case]
    with pytest.raises(ValueError, match=match):
        call()
