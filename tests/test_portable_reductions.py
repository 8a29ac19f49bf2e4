"""lockstep.kernels.portable's tree_sum and matmul_nt against a plain reference of the documented order.

The engine's versions lay the products out in one reused buffer and add the tree's levels into it
in place (issue 38: the CPU reference's speed). The reference below builds the same tree from a
Python list of slices, one new tensor per addition, exactly as the module docstring reads: the
tail folded onto the head, then halving. Every element must come out with the same bits, on
awkward lengths (1, 2, 3, odd, powers of two, 2880, 2881, empty dims), in fp32, bf16 and fp64,
whatever the chunking."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from lockstep.kernels import portable

DTYPES = [torch.float32, torch.bfloat16, torch.float64]


def reference_tree_sum(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The documented order, one torch.add per pair of terms (each one IEEE addition per element)."""
    terms = list(x.unbind(dim))
    n = len(terms)
    if n == 0:
        return x.new_zeros(x.shape[:dim % x.dim()] + x.shape[dim % x.dim() + 1:])
    p = 1 << (n.bit_length() - 1)
    terms = [torch.add(terms[i], terms[p + i]) if i < n - p else terms[i] for i in range(p)]
    while p > 1:
        p //= 2
        terms = [torch.add(terms[i], terms[i + p]) for i in range(p)]
    return terms[0]


def reference_matmul_nt(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """y[..., m, n] = tree_sum over k of the rounded products x[..., m, k] * w[..., n, k]."""
    products = torch.mul(x[..., :, None, :], w[..., None, :, :])      # [..., M, N, K], one rounding each
    return reference_tree_sum(products, -1)


def _values(shape, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g, dtype=torch.float64) * 8 - 4).to(dtype)


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 12, 31, 32, 33, 96, 127, 129, 2880, 2881])
def test_tree_sum_is_the_reference_order_on_every_dim(n, dtype):
    x = _values((3, n, 5), n, dtype)
    for dim in (0, 1, 2, -1):
        for keepdim in (False, True):
            want = reference_tree_sum(x, dim)
            want = want.unsqueeze(dim % 3) if keepdim else want
            assert _bits_equal(portable.tree_sum(x, dim, keepdim), want), (dim, keepdim)
    assert _bits_equal(portable.tree_sum(x.transpose(0, 1), 0), reference_tree_sum(x, 1))   # strided input


@pytest.mark.parametrize("shape", [(0,), (4, 0), (0, 3), (2, 0, 3)])
def test_tree_sum_of_empty_dims(shape):
    x = torch.ones(shape)
    for dim in range(len(shape)):
        assert _bits_equal(portable.tree_sum(x, dim), reference_tree_sum(x, dim))


def test_tree_sum_leaves_its_input_alone():
    x = _values((6, 13), 0, torch.float32)
    before = x.clone()
    portable.tree_sum(x, -1)
    portable.tree_sum(x, 0, keepdim=True)
    assert _bits_equal(x, before)


def test_the_order_is_not_left_to_right():
    """The reference is the documented tree and not just any sum: it differs from a sequential one."""
    x = _values(2881, 7, torch.float32)
    seq = torch.zeros((), dtype=torch.float32)
    for v in x:
        seq = torch.add(seq, v)
    assert not _bits_equal(reference_tree_sum(x, 0), seq)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("K", [0, 1, 2, 3, 5, 8, 12, 17, 32, 96, 160, 2880, 2881])
def test_matmul_nt_is_the_reference_order(K, dtype):
    x, w = _values((3, K), K, dtype), _values((7, K), K + 1, dtype)
    assert _bits_equal(portable.matmul_nt(x, w), reference_matmul_nt(x, w))
    xb, wb = _values((2, 3, K), K + 2, dtype), _values((2, 5, K), K + 3, dtype)    # leading dims
    assert _bits_equal(portable.matmul_nt(xb, wb), reference_matmul_nt(xb, wb))


@pytest.mark.parametrize("chunk", [1, 5, 64, 1000])
def test_matmul_nt_bits_do_not_depend_on_the_chunking(monkeypatch, chunk):
    """Small chunks: many chunks over M and N, ragged last ones, the buffer reused by each."""
    x, w = _values((2, 9, 37), 1, torch.float32), _values((2, 11, 37), 2, torch.float32)
    want = reference_matmul_nt(x, w)
    monkeypatch.setattr(portable, "_MATMUL_CHUNK", chunk)
    assert _bits_equal(portable.matmul_nt(x, w), want)


def test_matmul_nt_on_strided_and_empty_operands():
    x, w = _values((4, 1, 96), 3, torch.float32), _values((4, 160, 96), 4, torch.float32)
    xs, ws = x[..., 12:24], w[..., 12:24]                         # a K chunk, as engine/experts.py passes
    assert _bits_equal(portable.matmul_nt(xs, ws), reference_matmul_nt(xs, ws))
    xt = _values((40, 6), 5, torch.float32).t()                  # [6, 40], K strided
    assert _bits_equal(portable.matmul_nt(xt, w[0, :9, :40]), reference_matmul_nt(xt, w[0, :9, :40]))
    for xe, we in [((0, 5), (3, 5)), ((2, 5), (0, 5)), ((0, 2, 5), (0, 3, 5))]:
        out = portable.matmul_nt(torch.ones(xe), torch.ones(we))
        assert out.shape == (*xe[:-1], we[-2])


SHAPES = st.tuples(st.integers(0, 2), st.integers(0, 5), st.integers(0, 6), st.integers(0, 70))


@settings(max_examples=60, deadline=None)
@given(shape=SHAPES, chunk=st.sampled_from([3, 50, 1 << 20]), dtype=st.sampled_from(DTYPES),
       seed=st.integers(0, 2 ** 16))
def test_matmul_nt_any_shape(shape, chunk, dtype, seed):
    B, M, N, K = shape
    lead = (B,) if B else ()
    x, w = _values((*lead, M, K), seed, dtype), _values((*lead, N, K), seed + 1, dtype)
    old = portable._MATMUL_CHUNK
    portable._MATMUL_CHUNK = chunk
    try:
        got = portable.matmul_nt(x, w)
    finally:
        portable._MATMUL_CHUNK = old
    assert _bits_equal(got, reference_matmul_nt(x, w))


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(0, 9), min_size=1, max_size=4), data=st.data(), dtype=st.sampled_from(DTYPES))
def test_tree_sum_any_shape(shape, data, dtype):
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = _values(tuple(shape), sum(shape), dtype)
    assert _bits_equal(portable.tree_sum(x, dim), reference_tree_sum(x, dim))
