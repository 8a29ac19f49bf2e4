"""kernels/portable.py past one chunk: matmul_nt's chunking never changes an element (each is a
tree_sum of its K products in the operands' promoted dtype), normal's chunk of pairs is part of
its definition, and exp64's overflow and underflow edges. Chunk sizes are made small here."""

from __future__ import annotations

import math

import pytest
import torch

from lockstep.kernels import portable


def _reference(x, w):
    """Each output element from its definition: tree_sum of the K products (promoted dtype)."""
    return portable.tree_sum(x[..., :, None, :] * w[..., None, :, :], dim=-1).to(x.dtype)


@pytest.mark.parametrize("K", [1, 3, 5, 8])
@pytest.mark.parametrize("chunk", [1, 10, 40, 1 << 20])
def test_matmul_nt_is_the_same_in_any_chunks(monkeypatch, K, chunk):
    monkeypatch.setattr(portable, "_MATMUL_CHUNK", chunk)
    g = torch.Generator().manual_seed(K)
    x, w = torch.randn(2, 7, K, generator=g), torch.randn(2, 9, K, generator=g)
    got = portable.matmul_nt(x, w)
    assert got.shape == (2, 7, 9) and torch.equal(got, _reference(x, w))


def test_matmul_nt_multiplies_in_the_promoted_dtype(monkeypatch):
    monkeypatch.setattr(portable, "_MATMUL_CHUNK", 40)
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(3, 6, generator=g).to(torch.bfloat16), torch.randn(5, 6, generator=g)
    got = portable.matmul_nt(x, w)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, portable.tree_sum(x.float()[:, None, :] * w[None], dim=-1).to(torch.bfloat16)), \
        "the products and sums in float32 (torch.mul's promotion), rounded to x's dtype once"


def test_matmul_nt_works_on_the_operands_device():
    x, w = torch.empty(2, 3, 4, device="meta"), torch.empty(2, 5, 4, device="meta")
    out = portable.matmul_nt(x, w)
    assert out.shape == (2, 3, 5) and out.device.type == "meta"


def _normal_by_definition(n, seed, pairs):
    """Box-Muller on float64 uniforms drawn `pairs` pairs at a time: each chunk's cosines, then its sines."""
    g, out = torch.Generator().manual_seed(seed), []
    for start in range(0, n, 2 * pairs):
        count = min(n - start, 2 * pairs)
        u = torch.rand(2 * ((count + 1) // 2), generator=g, dtype=torch.float64)
        radius = portable.sqrt64(portable.log64(1.0 - u[0::2]) * -2.0)
        sin, cos = portable.sincos64(u[1::2] * (2.0 * math.pi))
        out.append(torch.cat([radius * cos, radius * sin])[:count])
    return torch.cat(out)


@pytest.mark.parametrize("n", [1, 6, 11, 14])
def test_normal_draws_its_pairs_a_chunk_at_a_time(monkeypatch, n):
    monkeypatch.setattr(portable, "_NORMAL_CHUNK", 3)
    got = portable.normal((n,), torch.Generator().manual_seed(n), torch.float64)
    assert got.dtype == torch.float64 and torch.equal(got, _normal_by_definition(n, n, 3))
    got32 = portable.normal((n,), torch.Generator().manual_seed(n))
    assert got32.dtype == torch.float32 and torch.equal(got32, _normal_by_definition(n, n, 3).float())


def test_exp64_at_its_overflow_and_underflow_edges():
    x = torch.tensor([709.782712893384, 709.79, 710.5, -745.1, -745.2, -745.5, -746.5, 1e6, -1e6],
                     dtype=torch.float64)
    y = portable.exp64(x)
    assert math.isfinite(y[0]) and y[0] > 1.7e308, "the largest x whose exp is finite"
    assert y[1] == y[2] == math.inf
    assert y[3] == 5e-324 and y[4] == 0.0, "exp(-745.1) rounds to the smallest subnormal, exp(-745.2) to 0"
    assert y[5:].tolist() == [0.0, 0.0, math.inf, 0.0]
    assert torch.equal(portable.exp64(x.float()), portable.exp64(x.float().double())), \
        "a float32 input is computed in float64"
