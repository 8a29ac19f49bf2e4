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


def test_normal_computes_on_the_device_it_is_given(monkeypatch):
    """The draws come from the CPU generator; the float64 arithmetic and the result are on `device`
    ("meta" here: no values, only where each step runs)."""
    seen = []
    for name in ("sqrt64", "log64"):
        real = getattr(portable, name)
        monkeypatch.setattr(portable, name, lambda x, real=real, name=name: seen.append((name, x.device.type)) or real(x))
    out = portable.normal((2, 3), torch.Generator().manual_seed(0), device="meta")
    assert out.device.type == "meta" and out.shape == (2, 3) and out.dtype == torch.float32
    assert seen == [("log64", "meta"), ("sqrt64", "meta")]


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


def test_scalar_log_is_log64_of_the_float64_value():
    for v in (0.1, 2.0, 1e-300, 7.5e300):
        assert portable.scalar_log(v) == portable.log64(torch.tensor([v], dtype=torch.float64))[0].item()
    assert portable.scalar_log(0.1) != portable.log64(torch.tensor([0.1], dtype=torch.float32).double())[0].item(), \
        "0.1 taken as a double, not rounded to float32 first"


def test_sqrt_takes_float32_or_float64_only():
    x = torch.tensor([2.0, 0.5], dtype=torch.float64)
    assert torch.equal(portable.sqrt(x), portable.sqrt64(x)) and portable.sqrt(x).dtype == torch.float64
    assert portable.sqrt(x.float()).dtype == torch.float32
    with pytest.raises(TypeError) as e:
        portable.sqrt(x.half())
    assert str(e.value) == "portable.sqrt: float32 or float64, got torch.float16"


def test_sqrt64_is_correctly_rounded_for_subnormals_and_its_specials():
    """Against math.sqrt (correctly rounded by IEEE 754), over subnormals, normals of every scale
    and the specials: sqrt(-0) = -0, 0 stays 0, a negative number or NaN gives NaN."""
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(1, 1 << 52, (300,), generator=g)                          # subnormals
    normal = torch.randint(1 << 52, 0x7FF0000000000000, (700,), generator=g)       # every exponent
    x = torch.cat([bits, normal, torch.tensor([1, 2, 3, (1 << 52) - 1, 1 << 52])]).view(torch.float64)
    want = torch.tensor([math.sqrt(v) for v in x.tolist()], dtype=torch.float64)
    assert torch.equal(portable.sqrt64(x).view(torch.int64), want.view(torch.int64))
    specials = portable.sqrt64(torch.tensor([-0.0, 0.0, 1.0, -1.0, -5e-324, math.inf, -math.inf, math.nan],
                                            dtype=torch.float64))
    assert specials[:3].tolist() == [0.0, 0.0, 1.0] and math.copysign(1, specials[0]) == -1.0
    assert math.copysign(1, specials[1]) == 1.0 and specials[5] == math.inf
    assert all(math.isnan(v) for v in specials[[3, 4, 6, 7]].tolist())


def test_sqrt32_is_correctly_rounded_for_small_and_large_float32():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, 0x7F800000, (2000,), generator=g, dtype=torch.int64).to(torch.int32).view(torch.float32)
    x = torch.cat([x, torch.tensor([1e-45, 1.2e-38, 3.4e38])])
    want = torch.tensor([math.sqrt(v) for v in x.tolist()], dtype=torch.float64).to(torch.float32)
    got = portable.sqrt32(x)
    assert got.dtype == torch.float32 and torch.equal(got.view(torch.int32), want.view(torch.int32))


def test_softmax_and_log_softmax_take_each_rows_own_maximum_along_dim():
    x = torch.tensor([[0.0, 1.0, 2.0], [1000.0, 1001.0, 999.0]], dtype=torch.float64)
    for dim in (-1, 1, 0):
        s, ls = portable.softmax(x, dim=dim), portable.log_softmax(x, dim=dim)
        assert not s.isnan().any() and torch.allclose(s.sum(dim), torch.ones(1, dtype=torch.float64))
        assert torch.allclose(ls, torch.log_softmax(x, dim=dim), atol=1e-12, rtol=0)
    t = x.T.contiguous()
    assert torch.equal(portable.softmax(x, dim=0), portable.softmax(t, dim=-1).T), "dim 0 is the rows of the transpose"
    assert torch.equal(portable.log_softmax(x, dim=0), portable.log_softmax(t, dim=-1).T)


def test_sincos64_domain_ends_at_1_6e6_inclusive():
    sin, cos = portable.sincos64(torch.tensor([1.6e6, 1600000.5, 2e6, math.inf, 1.0], dtype=torch.float64))
    assert math.isfinite(sin[0]) and math.isfinite(cos[0])
    assert all(math.isnan(v) for v in sin[1:4].tolist()) and all(math.isnan(v) for v in cos[1:4].tolist())
    s32, c32 = portable.sincos64(torch.tensor([0.3, 2.5], dtype=torch.float32))
    s64, c64 = portable.sincos64(torch.tensor([0.3, 2.5], dtype=torch.float32).double())
    assert torch.equal(s32, s64) and torch.equal(c32, c64) and s32.dtype == torch.float64


def test_prefix_sum_along_an_inner_dim():
    x = torch.randn(3, 7, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got = portable.prefix_sum(x, dim=-1)
    assert torch.equal(got, torch.stack([portable.prefix_sum(row) for row in x]))
    assert torch.equal(portable.prefix_sum(x, dim=0), portable.prefix_sum(x.T.contiguous(), dim=-1).T)


# --------------------------------------------------------------------------- the square root's edges
# For X in [1, 4) and its nearest double y, X - y^2 is exactly on a rounding test's boundary only
# at two doubles: X = 1 + 2^-52 (y = 1, R = M) and X = 4 - 2^-51 (y = 2 - 2^-52, R = M), where
# `R > M` must stay strict; and a start one ulp above at X = 1 + 2^-52 has R + M = 0 exactly.
_EDGES = (1.0 + 2.0 ** -52, 4.0 - 2.0 ** -51)


def test_sqrt64_on_the_two_doubles_whose_test_lands_on_its_boundary():
    xs = [math.ldexp(x, 2 * k) for x in _EDGES for k in (-300, -1, 0, 1, 7, 400)]
    got = portable.sqrt64(torch.tensor(xs, dtype=torch.float64)).tolist()
    assert got == [math.sqrt(x) for x in xs]


def test_the_newton_value_stays_in_one_to_two():
    """_nearest_sqrt reads y's mantissa as y in [1, 2): the Newton value of X just below 4 rounds
    to 2.0 and is clamped to the double below it."""
    y = portable._newton_sqrt(torch.tensor([1.0, 1.0 + 2.0 ** -52, 4.0 - 2.0 ** -51, 4.0 - 2.0 ** -50],
                                           dtype=torch.float64))
    assert y.tolist() == [1.0, 1.0, portable._BELOW_TWO, portable._BELOW_TWO]


@pytest.mark.parametrize("off", [-3, -2, -1, 1, 2, 3])
def test_the_correction_moves_a_start_up_to_three_ulps_off_to_the_nearest(off):
    X = torch.tensor([*_EDGES, 2.0, 3.0, 1.5, 2.0 ** 0.5 * 2, 3.999], dtype=torch.float64)
    nearest = torch.tensor([math.sqrt(x) for x in X.tolist()], dtype=torch.float64)
    start = nearest.view(torch.int64) + off
    start = torch.where(start.view(torch.float64) < 1.0, torch.ones_like(start).view(torch.float64).view(torch.int64),
                        start).view(torch.float64).clamp(1.0, portable._BELOW_TWO)
    assert portable._nearest_sqrt(X, start).tolist() == nearest.tolist()


# --------------------------------------------------------------------------- log64 beside its Triton twin
# m exactly at _SQRT2 (x = _SQRT2 * 2^e: `>` keeps it, `>=` would halve it, which moves the last
# bit of 10 of the 2046 such x), and inputs where one more series term moves the last bit.
_SERIES_EDGES = ["0x1.64b4b1ea9c531p+0", "0x1.6358a507b5c06p+0", "0x1.63ec2d52d81e2p+0", "0x1.6f65b14f719a8p-1",
                 "0x1.641dc78b394a6p-1", "0x1.69dd1e7865217p-1", "0x1.555aebfb2f4bcp+0", "0x1.5fcd5437b9321p+0"]


def test_log64_at_its_reductions_edge_is_the_triton_versions_bits():
    import numpy as np

    from lockstep.kernels._common import INTERPRET
    from tests.test_portable import _exp_log_kernel
    if not INTERPRET:
        pytest.skip("compiled kernels use the GPU's own log")
    xs = [math.ldexp(portable._SQRT2, e) for e in range(-1021, 1024)] + [float.fromhex(h) for h in _SERIES_EDGES]
    x = torch.tensor(xs, dtype=torch.float64)
    e, lg = torch.empty_like(x), torch.empty_like(x)
    with np.errstate(all="ignore"):
        _exp_log_kernel[(1,)](x, e, lg, len(xs), BLOCK=4096)
    assert lg.view(torch.int64).equal(portable.log64(x).view(torch.int64))
