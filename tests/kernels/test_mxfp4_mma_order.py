"""MXFP4 prefill as dense tiles (kernels.moe, "MXFP4 prefill as dense tiles"): the experts decoded
once into the order the compiled MXFP4 kernels' MMAs reduce each 64-column step in, then the dense
kernels. The column order and the decode are checked everywhere (interpreter and compiled); that
the dense launch then has the MXFP4 kernels' bits is a fact of the compiled MMAs, checked on a GPU
at the 20b shapes (the interpreter sums a tile's columns in memory order, so there it would not
hold, and the engine never takes the path: `mxfp4_dense`)."""

import pytest
import torch

from lockstep.engine.experts import LocalExperts, experts_grouped
from lockstep.engine.linear import k_chunk_bounds
from lockstep.kernels import moe, moe_mxfp4_order
from lockstep.kernels.moe import (MXFP4_STEP, clamped_swiglu_triton, expert_down_partials_triton, expert_gate_up_triton,
                         gather_columns, group_by_expert, mma_order_columns, mma_order_portable, mma_order_triton,
                         mxfp4_dense)
from tests.kernels.conftest import DEVICE
from tests.kernels.test_grouped_block_m import _packed, _weights
from tests.kernels.test_grouped_moe import ALPHA, LIMIT, same_bits, tokens

BF16 = torch.bfloat16


def _order(s):
    """Position s of a 64-column step -> its column: MMA i = s // 16 takes the pairs (2j, 2j + 1), j % 4 == i."""
    i, t = divmod(s, 16)
    return 2 * (i + 4 * (t // 2)) + t % 2


@pytest.mark.parametrize("bounds, K", [(k_chunk_bounds(2880), 2880), (((0, 2880),), 2880),
                                       (((0, 40), (40, 96)), 96), (((0, 12), (12, 13), (13, 96)), 96)])
def test_columns_are_each_chunk_in_steps_of_64_in_mma_order(bounds, K):
    cols, padded = mma_order_columns(bounds, K, "cpu")
    cols = cols.tolist()
    assert len(padded) == len(bounds) and padded[0][0] == 0 and padded[-1][1] == len(cols)
    for (lo, hi), (p0, p1) in zip(bounds, padded):
        assert (p1 - p0) == -(-(hi - lo) // MXFP4_STEP) * MXFP4_STEP      # whole steps from the chunk's start
        mine = cols[p0:p1]
        assert sorted(c for c in mine if c != K) == list(range(lo, hi))   # every column once, no other
        for j, step in enumerate(range(p0, p1, MXFP4_STEP)):
            j0 = lo + j * MXFP4_STEP
            want = [j0 + _order(s) if j0 + _order(s) < hi else K for s in range(MXFP4_STEP)]
            assert cols[step:step + MXFP4_STEP] == want
    assert sorted(_order(s) for s in range(64)) == list(range(64))
    assert all(bk == MXFP4_STEP for _, bk, _, _ in moe.MXFP4_GPU_TILES.values())   # the step the order is of


def test_gather_columns_pads_with_zeros():
    x = torch.arange(1.0, 13.0).reshape(2, 6)
    cols = torch.tensor([5, 6, 0, 6, 2])
    assert gather_columns(x, cols).tolist() == [[6, 0, 1, 0, 3], [12, 0, 7, 0, 9]]


@pytest.mark.parametrize("dtype", [BF16, torch.float32])
def test_mma_order_decodes_exactly(dtype):
    """Random codes with the edge scales planted (0, 1: subnormal; 254: +-inf; 255: NaN) over chunks
    that start mid scale group: each position holds its column's exact value (NaN where the scale is
    255), padding +0."""
    blocks, scales = _packed(3, 40, 96, seed=5)
    bounds = ((0, 40), (40, 84), (84, 96))
    cols, _ = mma_order_columns(bounds, 96, DEVICE)
    got, want = mma_order_triton((blocks, scales), bounds, dtype), mma_order_portable((blocks, scales), bounds, dtype)
    assert got.shape == want.shape == (3, 40, cols.shape[0])
    assert got.isnan().any() and got.isinf().any() and same_bits(got, want)
    pads = (cols == 96)
    assert pads.any() and (got[:, :, pads] == 0).all() and not torch.signbit(got[:, :, pads]).any()


@pytest.mark.parametrize("dtype", [BF16, torch.float32])
def test_a_nan_group_past_a_chunks_end_leaves_its_padding_zero(dtype):
    """Every scale ordinary (the fast decode runs) but the group after a chunk's end, 255: the
    chunk's last step reaches into that group, and its positions there are padding, so +0 (a
    compiled bf16 decode once multiplied those +0 codes by the group's inf power: NaN)."""
    blocks, scales = _packed(2, 16, 128, seed=11)
    scales.fill_(127)
    scales[:, :, 1] = 255                                                # columns 32-63: the second chunk's
    bounds = ((0, 24), (24, 128))                                        # the first chunk's step: 0-63
    got, want = mma_order_triton((blocks, scales), bounds, dtype), mma_order_portable((blocks, scales), bounds, dtype)
    assert same_bits(got, want) and got[:, :, :64].isfinite().all() and got[:, :, 64:].isnan().any()


def test_bad_input_is_refused_by_name():
    blocks, scales = _packed(2, 8, 64, seed=9)
    cases = [((blocks, scales), ((0, 64),), torch.float16, "float32 or bfloat16"),
             ((blocks,), ((0, 64),), BF16, "pair of uint8"),
             ((blocks.float(), scales), ((0, 64),), BF16, "pair of uint8"),
             ((blocks, scales[:, :, :1]), ((0, 64),), BF16, "do not fit"),
             ((blocks, scales), ((0, 65),), BF16, r"within \[0, 64\]"),
             ((blocks, scales), ((-1, 3),), BF16, r"within \[0, 64\]"),
             ((blocks, scales), ((0, 8), (8, 8)), BF16, "nonempty")]
    for weight, bounds, dtype, match in cases:
        with pytest.raises(ValueError, match=match):
            mma_order_triton(weight, bounds, dtype)
        if match != "pair of uint8":
            with pytest.raises(ValueError, match=match):
                mma_order_portable(weight, bounds, dtype)
    with pytest.raises(ValueError, match="nonempty"):
        mma_order_columns(((4, 2),), 64, DEVICE)
    assert mma_order_triton((blocks, scales), (), BF16).shape == (2, 8, 0)


def test_the_policy_is_compiled_prefills_only(monkeypatch):
    assert not mxfp4_dense(10 ** 6, 32, BF16) or DEVICE.type == "cuda"
    monkeypatch.setattr(moe_mxfp4_order, "INTERPRET", False)
    edge = moe_mxfp4_order.MXFP4_DENSE_MIN_ROWS * 32                                # rows of 32 experts
    assert mxfp4_dense(edge, 32, BF16) and mxfp4_dense(16384 * 4, 32, BF16)     # a replay's forward
    assert not mxfp4_dense(edge - 1, 32, BF16) and not mxfp4_dense(32 * 4, 32, BF16)   # decode
    assert not mxfp4_dense(10 ** 6, 32, torch.float32)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled MMAs' order needs a GPU")
def test_a_prefill_as_dense_tiles_has_the_mxfp4_bits(monkeypatch):
    """gpt-oss-20b's H = I = 2880 (gate_up's 45 whole steps; down's 8 chunks of 360: five whole
    steps and one of 40 columns, each starting mid scale group), 600 tokens x 4 slots over 8 experts
    (300 rows an expert, which mxfp4_dense takes with the threshold at 128: in 128-row blocks), edge
    scales planted: the engine's partials equal the MXFP4 kernels' in 16-row blocks, bit for bit.
    The threshold is speed only; the shape keeps the GPU run short."""
    monkeypatch.setattr(moe_mxfp4_order, "MXFP4_DENSE_MIN_ROWS", 128)
    E, H, I, k, T = 8, 2880, 2880, 4, 600
    weights = _weights("mxfp4", E, H, I, BF16, seed=51)
    x, ids = tokens(T, H, k, E, BF16, seed=52)
    x = x / 64
    bounds = k_chunk_bounds(I)
    assert mxfp4_dense(T * k, E, BF16)
    gu_w, gu_b, dn_w = weights
    groups = group_by_expert(ids.reshape(-1), 0, E, 16)
    h = expert_gate_up_triton(x, k, groups, gu_w, gu_b)
    want = expert_down_partials_triton(clamped_swiglu_triton(h, ALPHA, LIMIT), groups, dn_w, bounds)
    got = experts_grouped(x, ids, LocalExperts(gu_w, gu_b, dn_w, tuple(bounds), 0, E, ALPHA, LIMIT),
                          every_expert_local=True)
    assert torch.isfinite(want).any() and not torch.isfinite(want).all()       # the planted scales reach it
    assert same_bits(got, want)
