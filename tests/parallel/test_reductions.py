"""The fixed-order pieces D4 rests on: the K-chunk tree, per-rank slices of it, and column
slices of the column-parallel layers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lockstep.engine.distributed import COLUMN_ALIGN, invariant_sum
from lockstep.engine.linear import K_CHUNKS, k_chunk_bounds, linear_k_chunked, tree_sum
from lockstep.kernels.matmul import linear_chunks_portable as k_chunk_partials, linear_portable as linear
from lockstep.kernels.moe import clamped_swiglu_portable as clamped_swiglu
from lockstep.engine.parallel import local_chunks


def test_tree_sum_is_the_fixed_tree_not_left_to_right():
    vals = [1e8, 1.0, -1e8, 1.0, 3.0, -7e7, 7e7, 0.5]
    p = [torch.tensor([v], dtype=torch.float32) for v in vals]
    tree = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]))
    seq = p[0]
    for q in p[1:]:
        seq = seq + q
    assert tree_sum(p).equal(tree) and not tree.equal(seq)
    with pytest.raises(ValueError, match="power-of-two"):
        tree_sum(p[:6])


def test_linear_k_chunked_is_the_tree_of_chunk_products():
    g = torch.Generator().manual_seed(0)
    for M, K, N in [(1, 64, 96), (5, 256, 64), (3, 72, 40), (1, 4096, 2880)]:
        x, w, b = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g), torch.randn(N, generator=g)
        parts = [torch.stack([linear(x[i:i + 1, lo:hi].clone(), w[:, lo:hi].contiguous())[0] for i in range(M)])
                 for lo, hi in k_chunk_bounds(K)]
        y = linear_k_chunked(x, w, b)
        assert y.equal(tree_sum(parts) + b)
        assert torch.allclose(y, F.linear(x, w, b), rtol=1e-4, atol=1e-3)
        assert invariant_sum(parts, 1, None).equal(tree_sum(parts))


@pytest.mark.parametrize("K, N", [(256, 64), (2880, 2880), (4096, 2880)])
@pytest.mark.parametrize("M", [1, 3])
def test_a_ranks_chunks_give_the_one_device_partials(M, K, N):
    g = torch.Generator().manual_seed(K + M)
    x, w = torch.randn(M, 2 * K, generator=g) * 4, torch.randn(N, K, generator=g)
    act = lambda t: clamped_swiglu(t, 1.702, 7.0)                                 # noqa: E731
    for prologue, per in ((None, 1), (act, 2)):
        xx = x[:, :K] if per == 1 else x
        full = k_chunk_partials(xx, w, k_chunk_bounds(K), prologue=prologue, x_per_k=per)
        for tp in (2, 4, 8):
            for r in range(tp):
                lo, hi, local = local_chunks(K, tp, r)
                mine = k_chunk_partials(xx[:, per * lo:per * hi].contiguous(), w[:, lo:hi].contiguous(), local,
                                        prologue=prologue, x_per_k=per)
                per_rank = K_CHUNKS // tp
                assert all(a.equal(b) for a, b in zip(mine, full[r * per_rank:(r + 1) * per_rank])), (tp, r)


def test_the_swiglu_is_position_invariant():
    """torch's own CPU sigmoid gives different bits in its vector body and its tail; the
    portable one (kernels.portable.sigmoid) is elementwise IEEE arithmetic, so any slice of I
    (a rank's I / tp, a K chunk) computes exactly those columns of the whole."""
    x = torch.randn(3, 2 * 72, generator=torch.Generator().manual_seed(0)) * 4
    whole = clamped_swiglu(x, 1.702, 7.0)
    for lo, hi in [(0, 9), (9, 40), (40, 72), (3, 4)]:
        assert clamped_swiglu(x[:, 2 * lo:2 * hi].clone(), 1.702, 7.0).equal(whole[:, lo:hi])


@pytest.mark.parametrize("K, N, tp", [(64, 128, 4), (64, 512, 8), (2880, 5760, 8), (2880, 512, 8), (2880, 8192, 4)])
def test_column_slices_of_a_row_product_keep_their_bits(K, N, tp):
    """Column parallel q/k/v, gate_up, lm_head rest on this: a [M, K] x [K, N/tp] product equals
    those columns of [M, K] x [K, N] (slices are a multiple of COLUMN_ALIGN columns, which the
    Triton kernels' fixed N tiles need)."""
    assert (N // tp) % COLUMN_ALIGN == 0
    g = torch.Generator().manual_seed(N)
    w, b = torch.randn(N, K, generator=g), torch.randn(N, generator=g)
    for _ in range(5):
        x = torch.randn(2, K, generator=g)
        full = linear(x, w, b)
        n = N // tp
        for r in range(tp):
            assert linear(x, w[r * n:(r + 1) * n].contiguous(), b[r * n:(r + 1) * n].contiguous()).equal(
                full[:, r * n:(r + 1) * n]), r
