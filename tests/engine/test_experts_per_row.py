"""lockstep.engine.experts.experts_per_row (the torch ops' experts, every spec's CPU reference) against
experts_per_expert, the loop over experts through kernels.matmul's portable linears: the same bits.

experts_per_row takes two shortcuts for speed (issue 38), each exact: it decodes every expert once
when a call has at least as many rows as experts (else each row decodes its own), and it computes
the down projection's equal K chunks in one batched portable matmul (else chunk by chunk). The
cases below reach both sides of each: rows < experts and rows >= experts, chunk bounds that are
equal and adjacent (I a multiple of 8) and ones that are not, dense fp32 and bf16 weights and
MXFP4 ones (whose decoded values are exact, so the dense path on them is the reference)."""

import pytest
import torch

from lockstep.engine.experts import LocalExperts, experts_per_expert, experts_per_row
from lockstep.engine.linear import k_chunk_bounds
from lockstep.engine.mxfp4 import Mxfp4Weight, dequantize, quantize

E, H = 4, 32


def _case(T, k, I, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(T, H, generator=g) * 2).to(dtype)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]) if T else torch.zeros(0, k, dtype=torch.int64)
    gate_up_w = (torch.randn(E, 2 * I, H, generator=g) / 4).to(dtype)
    gate_up_b = torch.randn(E, 2 * I, generator=g).to(dtype)
    down_w = (torch.randn(E, H, I, generator=g) / 4).to(dtype)
    return x, ids, gate_up_w, gate_up_b, down_w


def _run(fn, x, ids, gate_up_w, gate_up_b, down_w, bounds):
    return fn(x, ids, LocalExperts(gate_up_w, gate_up_b, down_w, tuple(bounds), 0, E, 1.702, 7.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,k", [(1, 2), (1, 4), (3, 2), (9, 3)])      # rows 2, 4 (= E), 6, 27
@pytest.mark.parametrize("I,bounds", [(48, "k_chunks"), (12, "k_chunks"), (48, "uneven")])
def test_experts_per_row_equals_the_loop_over_experts(T, k, I, bounds, dtype):
    """k_chunks: 8 equal chunks of 6 (I = 48), or of 1 and 2 (I = 12: unequal, chunk by chunk);
    uneven: three chunks of different widths."""
    bounds = k_chunk_bounds(I) if bounds == "k_chunks" else [(0, 5), (5, 21), (21, I)]
    args = _case(T, k, I, dtype, seed=T * 100 + I)
    want = _run(experts_per_expert, *args, bounds)
    got = _run(experts_per_row, *args, bounds)
    assert got.shape == (len(bounds), T * k, H) and torch.equal(got, want)


@pytest.mark.parametrize("T,k", [(1, 2), (5, 4)])                      # rows 2 < E, 20 >= E
def test_mxfp4_experts_per_row_equals_its_decoded_weights(T, k):
    x, ids, gate_up_w, gate_up_b, down_w = _case(T, k, 64, torch.float32, seed=7)
    packed = [Mxfp4Weight(*quantize(w)) for w in (gate_up_w, down_w)]
    dense = [dequantize(p.blocks, p.scales) for p in packed]
    bounds = k_chunk_bounds(64)
    want = _run(experts_per_expert, x, ids, dense[0], gate_up_b, dense[1], bounds)
    got = _run(experts_per_row, x, ids, packed[0], gate_up_b, packed[1], bounds)
    assert torch.equal(got, want)
