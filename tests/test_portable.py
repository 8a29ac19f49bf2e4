"""lockstep.kernels.portable: the written-down orders, checked against independent scalar code, and the
float64 kernels against torch's own (accuracy only: torch's are the non-portable ones)."""

import itertools
import math

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from lockstep.kernels import portable
from lockstep.kernels._common import INTERPRET
from lockstep.kernels.portable_tl import exp64, log64
from lockstep.kernels.rmsnorm import rms_norm_portable


def _uniform(n, lo, hi, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(dtype)


def _tree_sum_scalar(values):
    """The documented tree_sum order in numpy float32 scalars (each + one IEEE rounding)."""
    s = [np.float32(v) for v in values]
    n = len(s)
    p = 1 << (n.bit_length() - 1)
    s = [s[i] + s[p + i] if i < n - p else s[i] for i in range(p)]
    while p > 1:
        p //= 2
        s = [s[i] + s[i + p] for i in range(p)]
    return s[0]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 31, 96, 127, 129, 2880])
def test_tree_sum_is_the_documented_order(n):
    x = _uniform(n, -3, 3, n, torch.float32)
    want = _tree_sum_scalar(x.tolist())
    assert portable.tree_sum(x).numpy().tobytes() == np.float32(want).tobytes()
    # and not the left-to-right order (for a long enough vector the bits differ)
    if n == 2880:
        seq = np.float32(0)
        for v in x.tolist():
            seq = seq + np.float32(v)
        assert seq != want


def test_matmul_nt_is_products_then_tree_sum():
    x, w = _uniform(5 * 96, -2, 2, 1, torch.float32).reshape(5, 96), _uniform(7 * 96, -2, 2, 2, torch.float32).reshape(7, 96)
    y = portable.matmul_nt(x, w)
    for m, n in [(0, 0), (4, 6), (2, 3)]:
        prods = [np.float32(a) * np.float32(b) for a, b in zip(x[m].tolist(), w[n].tolist())]
        assert y[m, n].numpy().tobytes() == np.float32(_tree_sum_scalar(prods)).tobytes()
    # rows never depend on the other rows, nor on the chunking
    assert all(portable.matmul_nt(x[i:i + 1], w).equal(y[i:i + 1]) for i in range(5))
    assert portable.matmul_nt(x[None].expand(3, 5, 96), w[None].expand(3, 7, 96)).equal(y[None].expand(3, 5, 7))


def test_prefix_sum_is_hillis_steele():
    x = _uniform(37, 0, 1, 3)
    s = x.tolist()
    step = 1
    while step < len(s):
        s = [s[i] + s[i - step] if i >= step else s[i] for i in range(len(s))]
        step *= 2
    assert portable.prefix_sum(x).tolist() == s


def test_running_sum_is_left_to_right():
    x = _uniform(5000, 0, 1, 4)
    assert portable.running_sum(x).tolist() == list(itertools.accumulate(x.tolist()))
    assert portable.running_sum(x.to(torch.float32)).tolist() == list(itertools.accumulate(x.to(torch.float32).double().tolist()))


def _ulps(a, b):
    return int((a.view(torch.int64) - b.view(torch.int64)).abs().max())


def test_float64_kernels_are_accurate():
    x = _uniform(100001, -700, 700, 5)
    assert _ulps(portable.exp64(x), torch.exp(x)) <= 2
    y = portable.exp64(_uniform(100001, -690, 690, 6))
    assert _ulps(portable.log64(y), torch.log(y)) <= 2
    a = _uniform(100001, -3e5, 3e5, 7)
    s, c = portable.sincos64(a)
    assert (s - torch.sin(a)).abs().max() < 4e-16 and (c - torch.cos(a)).abs().max() < 4e-16


def test_float64_kernels_special_values():
    inf, nan = math.inf, math.nan
    e = portable.exp64(torch.tensor([-inf, inf, nan, 0.0, -745.0, 710.0, -1e300], dtype=torch.float64))
    assert e[0] == 0 and e[1] == inf and e[2].isnan() and e[3] == 1 and e[4] == 5e-324 and e[5] == inf and e[6] == 0
    lg = portable.log64(torch.tensor([0.0, -0.0, -1.0, inf, nan, 5e-324, 1.0, 2.0], dtype=torch.float64))
    assert lg[0] == -inf and lg[1] == -inf and lg[2].isnan() and lg[3] == inf and lg[4].isnan()
    assert abs(lg[5] - (-744.4400719213812)) < 1e-12 and lg[6] == 0 and abs(lg[7] - math.log(2)) < 2e-16
    s, c = portable.sincos64(torch.tensor([0.0, math.pi / 2, inf], dtype=torch.float64))
    assert s[0] == 0 and c[0] == 1 and abs(s[1] - 1) < 1e-16 and s[2].isnan() and c[2].isnan()


def test_softmax_and_friends():
    x = _uniform(3 * 50, -20, 20, 8, torch.float32).reshape(3, 50)
    x[1, :] = -math.inf
    x[1, 7] = 2.0
    p = portable.softmax(x)
    assert torch.allclose(p, torch.softmax(x, -1), atol=1e-6) and p[1, 7] == 1 and p[1, 0] == 0
    assert torch.allclose(portable.log_softmax(x[[0, 2]]), torch.log_softmax(x[[0, 2]], -1), atol=1e-5)
    z = _uniform(1000, -30, 30, 9, torch.float32)
    assert torch.allclose(portable.sigmoid(z), torch.sigmoid(z), atol=1e-7, rtol=1e-6)
    w = _uniform(96, 0.5, 1.5, 10, torch.float32)
    xn = x[[0, 2]]
    want = xn * torch.rsqrt(xn.pow(2).mean(-1, keepdim=True) + 1e-5) * w[:50]
    assert torch.allclose(rms_norm_portable(xn, w[:50], 1e-5), want, rtol=1e-6)


def test_normal_is_standard_and_chunk_independent(monkeypatch):
    z = portable.normal((200000,), torch.Generator().manual_seed(0))
    assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1) < 0.01
    monkeypatch.setattr(portable, "_NORMAL_CHUNK", 1000)      # a different chunk size is a different
    z2 = portable.normal((200000,), torch.Generator().manual_seed(0))   # draw order: the
    assert not z2.equal(z)                                            # constant is part of the definition
    monkeypatch.undo()
    assert portable.normal((100, 2000), torch.Generator().manual_seed(0)).flatten().equal(z)


@triton.jit
def _exp_log_kernel(x_ptr, e_ptr, l_ptr, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < N
    x = tl.load(x_ptr + i, mask=ok, other=1.0)
    tl.store(e_ptr + i, exp64(x), mask=ok)
    tl.store(l_ptr + i, log64(tl.abs(x)), mask=ok)


@pytest.mark.skipif(not INTERPRET, reason="compiled kernels use the GPU's own exp and log")
def test_triton_interpreter_math_equals_torch_portable():
    """In the interpreter, kernels.portable_tl is kernels.portable, bit for bit."""
    x = _uniform(4096, -750, 750, 11)
    x[:5] = torch.tensor([0.0, math.inf, -math.inf, 1e-310, math.nan], dtype=torch.float64)
    e, lg = torch.empty_like(x), torch.empty_like(x)
    with np.errstate(all="ignore"):
        _exp_log_kernel[(4,)](x, e, lg, 4096, BLOCK=1024)
    assert e.view(torch.int64).equal(portable.exp64(x).view(torch.int64))
    assert lg.view(torch.int64).equal(portable.log64(x.abs()).view(torch.int64))
