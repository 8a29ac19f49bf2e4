"""Batch invariance of the building blocks: a row's bits must not depend on the row count."""

import math

import pytest
import torch
import torch.nn.functional as F

from lockstep.kernels.matmul import linear_portable as linear
from lockstep.kernels.moe import clamped_swiglu_portable as clamped_swiglu, top_k_lowest_index
from lockstep.kernels.rmsnorm import rms_norm_portable as rms_norm
from lockstep.engine.rope import rope_cos_sin, rope_frequencies
from lockstep.kernels.rope import apply_rope_portable as apply_rope
from lockstep.engine.config import preset
from lockstep.kernels import portable

ADVERSARIAL_M = [1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 65, 127, 129, 200]


@pytest.mark.parametrize("K, N", [(96, 128), (160, 512), (2880, 64), (128, 4)])
def test_linear_rows_do_not_depend_on_the_row_count(K, N):
    g = torch.Generator().manual_seed(K + N)
    w, b = torch.randn(N, K, generator=g), torch.randn(N, generator=g)
    x = torch.randn(200, K, generator=g)
    alone = torch.stack([linear(x[i:i + 1], w, b)[0] for i in range(200)])
    for M in ADVERSARIAL_M:
        assert linear(x[:M], w, b).equal(alone[:M]), M
    perm = torch.randperm(200, generator=g)
    assert linear(x[perm], w, b).equal(alone[perm])           # nor on the row's index
    assert linear(x, w, None).equal(portable.matmul_nt(x, w))        # the fixed-order product, no BLAS


def test_plain_torch_matmul_is_not_batch_invariant_here():
    """Why linear exists. If a torch build ever becomes invariant, this only skips."""
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(128, 96, generator=g), torch.randn(64, 96, generator=g)
    alone = torch.stack([F.linear(x[i:i + 1], w)[0] for i in range(64)])
    varying = [M for M in (2, 3, 8, 17, 64) if not F.linear(x[:M], w).equal(alone[:M])]
    if not varying:
        pytest.skip("this torch build's matmul happens to be batch invariant")
    assert varying


def test_batched_elementwise_and_row_reductions_are_row_invariant():
    """model.py runs these batched; their per-row result must not depend on the row count."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 160, generator=g) * 3
    w = torch.randn(160, generator=g)
    gate_up = torch.randn(200, 192, generator=g) * 4
    inv_freq, mscale = rope_frequencies(32, preset("tiny").rope)
    pos = torch.randint(0, 100000, (200,), generator=g)
    heads = torch.randn(200, 4, 32, generator=g)
    cos, sin = rope_cos_sin(pos, inv_freq, mscale)
    ref = {
        "rms_norm": torch.stack([rms_norm(x[i:i + 1], w, 1e-5)[0] for i in range(200)]),
        "swiglu": torch.stack([clamped_swiglu(gate_up[i:i + 1], 1.702, 7.0)[0] for i in range(200)]),
        "softmax": torch.stack([portable.softmax(x[i:i + 1], -1)[0] for i in range(200)]),
        "cos": torch.stack([rope_cos_sin(pos[i:i + 1], inv_freq, mscale)[0][0] for i in range(200)]),
        "rope": torch.stack([apply_rope(heads[i:i + 1], cos[i:i + 1], sin[i:i + 1])[0] for i in range(200)]),
    }
    for M in ADVERSARIAL_M:
        assert rms_norm(x[:M], w, 1e-5).equal(ref["rms_norm"][:M])
        assert clamped_swiglu(gate_up[:M], 1.702, 7.0).equal(ref["swiglu"][:M])
        assert portable.softmax(x[:M], -1).equal(ref["softmax"][:M])
        assert rope_cos_sin(pos[:M], inv_freq, mscale)[0].equal(ref["cos"][:M])
        assert apply_rope(heads[:M], cos[:M], sin[:M]).equal(ref["rope"][:M])


def test_swiglu_formula_and_clamps():
    gate_up = torch.tensor([[10.0, 10.0, -3.0, -9.0, 0.5, 2.0]])    # (gate, up) pairs
    out = clamped_swiglu(gate_up, 1.702, 7.0)[0]
    def ref(gt, up):
        gt, up = min(gt, 7.0), max(min(up, 7.0), -7.0)
        return gt / (1 + math.exp(-1.702 * gt)) * (up + 1)
    assert torch.allclose(out, torch.tensor([ref(10, 10), ref(-3, -9), ref(0.5, 2)]), rtol=1e-6)


def test_top_k_ties_go_to_the_lowest_index():
    values, ids = top_k_lowest_index(torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0]]), 2)
    assert ids.tolist() == [[1, 2]] and values.tolist() == [[3.0, 3.0]]
    _, ids = top_k_lowest_index(torch.zeros(1, 8), 4)
    assert ids.tolist() == [[0, 1, 2, 3]]
