"""lockstep.kernels.matmul: agreement with float64, masked tails, bitwise batch invariance."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from lockstep.kernels._common import INTERPRET
from lockstep.kernels.matmul import TILES, linear_portable, linear_triton
from tests.kernels.conftest import DEVICE

DTYPES = [torch.float32, torch.bfloat16]
# Stated tolerance against a float64 reference, weights scaled by 1/sqrt(K):
# fp32 output: 2e-5 absolute; bf16 output (one rounding to bf16 at the end): 1.6e-2 relative + 2e-2.
TOL = {torch.float32: dict(rtol=0, atol=2e-5), torch.bfloat16: dict(rtol=1.6e-2, atol=2e-2)}


def make(M, K, N, dtype, seed=0, bias=True):
    """x, W, b made on the CPU (the same values everywhere), on DEVICE."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = (torch.randn(N, K, generator=g) / max(K, 1) ** 0.5).to(dtype)
    b = torch.randn(N, generator=g).to(dtype) if bias else None
    return x.to(DEVICE), w.to(DEVICE), b.to(DEVICE) if bias else None


def ref64(x, w, b):
    """The float64 reference, computed on the CPU, returned on x's device."""
    y = x.cpu().double() @ w.cpu().double().T
    y = y + b.cpu().double() if b is not None else y
    return y.to(x.device)


@pytest.mark.parametrize("K, N, dtype", [
    (1, 1, torch.float32), (1, 127, torch.float32), (127, 129, torch.bfloat16), (129, 1, torch.float32),
    (129, 2881, torch.float32), (2880, 127, torch.bfloat16), (2881, 129, torch.float32),
    (2880, 2880, torch.float32),
])
def test_tails_agree_with_float64(K, N, dtype):
    x, w, b = make(3, K, N, dtype, seed=K + N)
    y = linear_triton(x, w, b)
    assert y.dtype == dtype and y.shape == (3, N) and torch.isfinite(y).all()
    torch.testing.assert_close(y.double(), ref64(x, w, b).to(dtype).double(), **TOL[dtype])
    torch.testing.assert_close(y.double(), linear_portable(x, w, b).double(), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_read_past_the_tails(dtype):
    """x and W are views into buffers whose bytes after the tensor are NaN: a missing tail mask
    in M, N or K (DESIGN §8 'unguarded tail') would read them and poison the output."""
    M, K, N = 5, 129, 131
    x0, w0, b = make(M, K, N, dtype, seed=3)
    xbuf = torch.full((M * K + 4096,), float("nan"), dtype=dtype, device=DEVICE)
    wbuf = torch.full((N * K + 4096,), float("nan"), dtype=dtype, device=DEVICE)
    xbuf[:M * K] = x0.reshape(-1)
    wbuf[:N * K] = w0.reshape(-1)
    x, w = xbuf[:M * K].view(M, K), wbuf[:N * K].view(N, K)
    y = linear_triton(x, w, b)
    assert torch.isfinite(y).all()
    assert y.equal(linear_triton(x0, w0, b))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_do_not_depend_on_M_or_position(dtype):
    """Each row alone, then inside batches of M rows at every rotation: bitwise equal. Compiled,
    the alone rows take the decode tile and the batches each tile of kernels.matmul `_gpu_tiles`
    (300: the prefill one); the interpreter has one tile set."""
    K, N = 300, 130
    big = 64 if INTERPRET else 300
    x, w, b = make(big, K, N, dtype, seed=7)
    alone = torch.cat([linear_triton(x[i:i + 1], w, b) for i in range(big)])
    for M in (2, 3, 5, 8, 16, 17, 33, 64) + (() if INTERPRET else (300,)):
        for shift in sorted({0, 1, M // 2, M - 1}):
            rolled = torch.roll(x[:M], shifts=shift, dims=0)
            y = torch.roll(linear_triton(rolled, w, b), shifts=-shift, dims=0)
            assert y.view(torch.uint8).equal(alone[:M].view(torch.uint8)), (M, shift)


def test_columns_do_not_depend_on_N():
    x, w, b = make(4, 200, 300, torch.float32, seed=9)
    full = linear_triton(x, w, b)
    for n in (1, 63, 64, 65, 129, 257):
        assert linear_triton(x, w[:n], b[:n]).equal(full[:, :n]), n


def test_run_to_run_and_no_bias():
    x, w, _ = make(9, 257, 65, torch.float32, seed=11)
    a, b = linear_triton(x, w, None), linear_triton(x, w, None)
    assert a.equal(b)
    torch.testing.assert_close(a.double(), ref64(x, w, None), rtol=0, atol=2e-5)


@settings(max_examples=12, deadline=None)
@given(M=st.integers(1, 40), K=st.integers(1, 300), N=st.integers(1, 300),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**31 - 1))
def test_property_agrees_and_row_alone(M, K, N, dtype, seed):
    x, w, b = make(M, K, N, dtype, seed=seed)
    y = linear_triton(x, w, b)
    torch.testing.assert_close(y.double(), ref64(x, w, b).to(dtype).double(), **TOL[dtype])
    r = seed % M
    assert linear_triton(x[r:r + 1], w, b).equal(y[r:r + 1])


def test_tiles_are_constants():
    bm, bn, bk, _, _ = TILES
    assert all(isinstance(v, int) and v >= 16 for v in (bm, bn, bk))
