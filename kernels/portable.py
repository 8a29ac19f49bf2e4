"""Portable arithmetic: results that are the same bits on every CPU (DESIGN §2, D0).

torch's own reductions and transcendental functions are not portable: `sum`, `softmax`,
`cumsum` and matmuls pick their blocking and vector width by the CPU (AVX2, AVX-512, the
scalar `default` path), and `exp`, `log`, `sin`, `cos`, `sigmoid`, `pow` and `randn` use
SLEEF's vector code on one CPU and libm on another; the bits differ (set
`ATEN_CPU_CAPABILITY=default` to see it on any machine). Everything here is built only from

    single IEEE-754 operations   +  -  *  /       (each one rounding, the same on every CPU)
    exact operations             max, min, comparisons, where, gather, integer and bit ops

applied elementwise, each its own torch call (so no compiler can fuse a multiply and an add
into an FMA). Square roots are not on that list: torch's CPU `sqrt` goes through MKL's vector
math, which is not correctly rounded and picks its code by CPU vendor and instruction set, so
`sqrt` below is built from the list (Newton steps, then an exact correction to the nearest
value). tests/test_primitive_oracle.py checks every op of the list against Python's own IEEE
arithmetic, and that the engine's portable path calls nothing else. A vectorised body and a scalar tail compute such an op identically, so the
result cannot depend on the instruction set, the thread count, or on which other rows share
the tensor. The same code gives the same bits on a CUDA device too.

Reductions have one written-down order:
    tree_sum     with p the largest power of two <= n: first s[i] = x[i] + x[p + i] for
                 i < n - p (the tail folded onto the head), then add the upper half onto the
                 lower half until one element is left: s[i] = s[i] + s[i + p/2], p halving
    prefix_sum   inclusive scan, Hillis-Steele: at step j, s[i] = s[i - 2^j] + s[i] (i >= 2^j)
    matmul_nt    y[m, n] = tree_sum_k(x[m, k] * w[n, k])   (one rounded product per term)
Where the terms and partial sums are kept (a fresh tensor per level, or one buffer added into in
place, as tree_sum and matmul_nt do for speed) never changes an element's operations, so never its
bits (tests/test_portable_reductions.py holds them to a plain list-of-slices version of this order).

Transcendentals are evaluated in float64 by range reduction and a fixed polynomial (Horner,
multiply then add), and the fp32 functions round that float64 result once. They are not
correctly rounded (a few float64 ulps), but they are the same function everywhere.
"""

from __future__ import annotations

import math

import torch

# ------------------------------------------------------------------------------ reductions


def tree_sum(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """Sum over `dim` in the fixed pairwise order of the module docstring."""
    dim = dim % x.dim()
    n = x.shape[dim]
    if n <= 1:                                           # nothing to add: 0 (+0.0), or the one term
        out = x.new_zeros(x.shape[:dim] + (1,) + x.shape[dim + 1:]) if n == 0 else x
        return out if keepdim else out.squeeze(dim)
    p = 1 << (n.bit_length() - 1)                        # the largest power of two <= n
    if p != n:                                           # fold the tail onto the head
        s = x.narrow(dim, 0, p).clone()
        s.narrow(dim, 0, n - p).add_(x.narrow(dim, p, n - p))
    else:                                                # the first halving
        p //= 2
        s = torch.add(x.narrow(dim, 0, p), x.narrow(dim, p, p))
    if p > 1:
        _halve_in_place(s, dim, p)
        s = torch.add(s.narrow(dim, 0, 1), s.narrow(dim, 1, 1))    # the last level, into a new tensor
    return s if keepdim else s.squeeze(dim)


def _halve_in_place(s: torch.Tensor, dim: int, p: int) -> None:
    """tree_sum's halving levels on s, whose first p (a power of two) entries along `dim` are the
    terms, in place down to the last two: s[:p/2] += s[p/2:p] while p > 2 (the same additions of
    the same operands as new tensors would hold, without allocating one per level). The caller
    adds the last two, s[0] + s[1], where it wants the result."""
    while p > 2:
        p //= 2
        s.narrow(dim, 0, p).add_(s.narrow(dim, p, p))


def prefix_sum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Inclusive cumulative sum over `dim`, Hillis-Steele order (see the module docstring)."""
    dim = dim % x.dim()
    n = x.shape[dim]
    step = 1
    while step < n:
        shifted = x.narrow(dim, 0, n - step)
        x = torch.cat([x.narrow(dim, 0, step), torch.add(shifted, x.narrow(dim, step, n - step))], dim=dim)
        step *= 2
    return x


_MATMUL_CHUNK = 1 << 20            # elements of the [..., m, n, K] product built at once (4 MB in fp32)


def matmul_nt(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [..., M, K] @ w[..., N, K]^T -> [..., M, N] (same leading dims) in x's dtype: each output
    a tree_sum of K rounded products. The products of a chunk of M and N go into one buffer,
    reused by every chunk, and tree_sum's levels add into it in place (no level allocates, and a
    chunk fits the last-level cache); the chunking bounds that buffer and never changes an
    element's operations."""
    *lead, M, K = x.shape
    N = w.shape[-2]
    out = x.new_empty((*lead, M, N))
    if out.numel() == 0:
        return out
    if K == 0:
        return out.zero_()
    batch = math.prod(lead)
    n_step = max(1, min(N, _MATMUL_CHUNK // (K * batch)))
    m_step = max(1, min(M, _MATMUL_CHUNK // (K * batch * n_step)))
    dtype = x.dtype if x.dtype == w.dtype else torch.promote_types(x.dtype, w.dtype)   # as torch.mul's
    buf = torch.empty(batch * m_step * n_step * K, dtype=dtype, device=x.device)
    p = 1 << (K.bit_length() - 1)                        # the largest power of two <= K
    for m0 in range(0, M, m_step):
        m = min(m_step, M - m0)
        xm = x[..., m0:m0 + m, None, :]                                   # [..., m, 1, K]
        for n0 in range(0, N, n_step):
            n = min(n_step, N - n0)
            prod = torch.mul(xm, w[..., None, n0:n0 + n, :], out=buf[:batch * m * n * K].view(*lead, m, n, K))
            if p != K:                                                    # fold the tail onto the head
                prod.narrow(-1, 0, K - p).add_(prod.narrow(-1, p, K - p))
            if p == 1:                                                    # K = 1: the product itself
                out[..., m0:m0 + m, n0:n0 + n] = prod[..., 0]
                continue
            _halve_in_place(prod, prod.dim() - 1, p)
            torch.add(prod[..., 0], prod[..., 1], out=out[..., m0:m0 + m, n0:n0 + n])   # the last level
    return out


# ------------------------------------------------------------------------- float64 kernels
# Constants are float64 literals; every step below is one IEEE operation on float64 tensors.

_LN2_HI = 6.93147180369123816490e-01    # ln 2 with its low 32 bits zero: k * _LN2_HI is exact
_LN2_LO = 1.90821492927058770002e-10    # ln 2 - _LN2_HI
_INV_LN2 = 1.44269504088896338700e+00
_EXP_COEFFS = [1.0 / math.factorial(i) for i in range(14)]    # Taylor, |r| <= ln2/2: error < 1e-17

_PIO2_1 = 1.57079632673412561417e+00    # first 33 bits of pi/2: k * _PIO2_1 is exact for k < 2^20
_PIO2_2 = 6.07710050630396597660e-11    # next 33 bits
_PIO2_3 = 2.02226624879595063154e-21    # pi/2 - _PIO2_1 - _PIO2_2
_TWO_OVER_PI = 6.36619772367581382433e-01
_SIN_COEFFS = [(-1.0) ** i / math.factorial(2 * i + 1) for i in range(9)]   # |r| <= pi/4
_COS_COEFFS = [(-1.0) ** i / math.factorial(2 * i) for i in range(10)]

_MANTISSA = (1 << 52) - 1
_SQRT2 = 1.41421356237309514547e+00


def _horner(r: torch.Tensor, coeffs) -> torch.Tensor:
    """coeffs[0] + r * (coeffs[1] + r * (...)), multiply then add, never fused; in place in one
    accumulator (the same operations as a new tensor per step, without allocating one)."""
    p = torch.full_like(r, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        torch.mul(p, r, out=p).add_(c)
    return p


def _pow2(k: torch.Tensor) -> torch.Tensor:
    """2.0 ** k for integer-valued int64 k in [-1022, 1023], built from its bits (exact)."""
    return ((k + 1023) << 52).view(torch.float64)


def exp64(x: torch.Tensor) -> torch.Tensor:
    """e^x for float64 x: x = k ln2 + r, |r| <= ln2/2, e^r by its Taylor polynomial."""
    x = x.to(torch.float64)
    xc = x.clamp(-746.0, 710.0)                                   # beyond: 0 or inf below
    k = torch.floor(torch.add(torch.mul(xc, _INV_LN2), 0.5))     # nearest integer
    r = torch.sub(torch.sub(xc, torch.mul(k, _LN2_HI)), torch.mul(k, _LN2_LO))
    p = _horner(r, _EXP_COEFFS)
    ki = k.to(torch.int64)
    k1 = torch.div(ki, 2, rounding_mode="floor")                  # 2^k = 2^k1 * 2^(k - k1), both normal
    y = torch.mul(torch.mul(p, _pow2(k1)), _pow2(ki - k1))
    y = torch.where(x > 709.782712893384, math.inf, y)
    y = torch.where(x < -745.2, 0.0, y)
    return torch.where(torch.isnan(x), x, y)


def log64(x: torch.Tensor) -> torch.Tensor:
    """ln x for float64 x: x = m 2^e with m in [sqrt(2)/2, sqrt(2)), ln m = 2 atanh(f / (2 + f))."""
    x = x.to(torch.float64)
    tiny = x < 2.2250738585072014e-308                            # subnormal (or <= 0): scale up
    xs = torch.where(tiny, torch.mul(x, 18446744073709551616.0), x)   # * 2^64, exact
    bits = xs.view(torch.int64)
    e = ((bits >> 52) & 0x7FF) - 1023 - torch.where(tiny, 64, 0)
    m = ((bits & _MANTISSA) | (1023 << 52)).view(torch.float64)   # [1, 2)
    big = m > _SQRT2
    m = torch.where(big, torch.mul(m, 0.5), m)                    # [sqrt(2)/2, sqrt(2)], exact
    e = e + big.to(torch.int64)
    f = torch.sub(m, 1.0)
    s = torch.div(f, torch.add(f, 2.0))                           # |s| <= 0.1716
    s2 = torch.mul(s, s)
    series = _horner(s2, [2.0 / (2 * i + 1) for i in range(12)])  # 2 (1 + s^2/3 + s^4/5 + ...)
    log_m = torch.mul(s, series)
    ef = e.to(torch.float64)
    y = torch.add(torch.mul(ef, _LN2_HI), torch.add(torch.mul(ef, _LN2_LO), log_m))
    y = torch.where(x == 0, -math.inf, y)
    y = torch.where(x == math.inf, math.inf, y)
    return torch.where((x < 0) | torch.isnan(x), math.nan, y)


def sincos64(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sin x, cos x) for float64 x with |x| < 2^20 * pi/2 (RoPE angles: positions < 2^20)."""
    x = x.to(torch.float64)
    k = torch.round(torch.mul(x, _TWO_OVER_PI))
    r = torch.sub(torch.sub(torch.sub(x, torch.mul(k, _PIO2_1)), torch.mul(k, _PIO2_2)),
                  torch.mul(k, _PIO2_3))                          # |r| <= pi/4 (+ rounding)
    r2 = torch.mul(r, r)
    s = torch.mul(r, _horner(r2, _SIN_COEFFS))
    c = _horner(r2, _COS_COEFFS)
    q = k.to(torch.int64) & 3                                     # quadrant
    sin = torch.where(q == 0, s, torch.where(q == 1, c, torch.where(q == 2, -s, -c)))
    cos = torch.where(q == 0, c, torch.where(q == 1, -s, torch.where(q == 2, -c, s)))
    bad = ~torch.isfinite(x) | (x.abs() > 1.6e6)
    return torch.where(bad, math.nan, sin), torch.where(bad, math.nan, cos)


# --------------------------------------------------------------------------- square root
# Correctly rounded, from + - * / and integer ops only. For X in [1, 4) and y in [1, 2) with
# y = M * 2^-52 (M the 53-bit integer mantissa), y is the nearest double to sqrt(X) iff X lies
# between (y - h)^2 and (y + h)^2, h = 2^-53. Dekker's product gives y^2 = p + err exactly, and
# (X - p) is exact (Sterbenz), so R = (X - y^2) * 2^104 is an exact int64; then
#   X > (y + h)^2  <=>  R - M - 1/4 > 0  <=>  R > M          (y too small)
#   X < (y - h)^2  <=>  R + M - 1/4 < 0  <=>  R + M <= 0     (y too large; only when y > 1)
# (a square root is never exactly halfway between two doubles, so no tie can occur).

_SPLIT = 134217729.0                   # 2^27 + 1: Veltkamp's split of a double into 26 + 27 bits
_TWO_104 = 2.0 ** 104
_BELOW_TWO = 1.9999999999999998        # the largest double below 2


def _newton_sqrt(X: torch.Tensor) -> torch.Tensor:
    """sqrt(X) for X in [1, 4) to about an ulp: five Newton steps from a line through (1, 1)
    and (4, 2), whose relative error (< 6 %) squares each step."""
    y = torch.div(torch.add(X, 2.0), 3.0)
    for _ in range(5):
        y = torch.mul(torch.add(y, torch.div(X, y)), 0.5)
    return y.clamp(1.0, _BELOW_TWO)


def _nearest_sqrt(X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Move y (within a few ulps of sqrt(X), both as in the comment above) to the nearest."""
    for _ in range(3):
        p = torch.mul(y, y)
        c = torch.mul(y, _SPLIT)
        hi = torch.sub(c, torch.sub(c, y))
        lo = torch.sub(y, hi)
        err = torch.sub(torch.mul(lo, lo),
                        torch.sub(torch.sub(torch.sub(p, torch.mul(hi, hi)), torch.mul(lo, hi)), torch.mul(hi, lo)))
        r = (torch.mul(torch.sub(X, p), _TWO_104).to(torch.int64)
             - torch.mul(err, _TWO_104).to(torch.int64))             # (X - y^2) * 2^104, exact
        m = (y.view(torch.int64) & _MANTISSA) | (1 << 52)
        up = torch.nextafter(y, torch.full_like(y, 2.0))
        down = torch.nextafter(y, torch.ones_like(y))
        y = torch.where(r > m, up, torch.where((r + m <= 0) & (y > 1.0), down, y))
    return y


def sqrt64(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded square root of float64 x (IEEE 754: sqrt(-0) = -0, sqrt(+inf) = +inf,
    NaN for x < 0 and for NaN). x = X * 2^(2k) with X in [1, 4), sqrt(x) = sqrt(X) * 2^k."""
    return _reduced_sqrt(x.to(torch.float64), lambda X: _nearest_sqrt(X, _newton_sqrt(X)), subnormal=True)


def _reduced_sqrt(x: torch.Tensor, root, subnormal: bool) -> torch.Tensor:
    """sqrt of float64 x as root(X) * 2^k for x = X * 2^(2k), X in [1, 4), with IEEE's specials.
    subnormal: x may be subnormal (scaled by 2^108 first, exactly); sqrt32's never is."""
    if subnormal:
        tiny = (x > 0) & (x < 2.2250738585072014e-308)            # subnormal: * 2^108, exact
        bits = torch.where(tiny, torch.mul(x, 2.0 ** 108), x).view(torch.int64)
        e = ((bits >> 52) & 0x7FF) - 1023 - torch.where(tiny, 108, 0)
    else:
        bits = x.view(torch.int64)
        e = ((bits >> 52) & 0x7FF) - 1023
    odd = e & 1
    X = ((bits & _MANTISSA) | ((1023 + odd) << 52)).view(torch.float64)   # [1, 2) or [2, 4)
    y = root(X)
    k = (e - odd) >> 1                                            # exact halving of an even e
    y = (y.view(torch.int64) + (k << 52)).view(torch.float64)    # y * 2^k, exact
    y = torch.where(x == 0, x, y)                                 # keeps the sign of zero
    y = torch.where(x == math.inf, x, y)
    return torch.where((x < 0) | torch.isnan(x), math.nan, y)


def sqrt(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded square root in x's dtype (float32 or float64). float32: sqrt32 below."""
    if x.dtype == torch.float64:
        return sqrt64(x)
    if x.dtype != torch.float32:
        raise TypeError(f"portable.sqrt: float32 or float64, got {x.dtype}")
    return sqrt32(x)


def sqrt32(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded float32 square root of float32 x: sqrt64's Newton value rounded once
    to float32, without sqrt64's correction to the nearest double (a third of the operations; the
    RMSNorm of every forward calls it). The same bits as sqrt64(x as float64) rounded to float32,
    which is correctly rounded (rounding twice is harmless when 53 >= 2 * 24 + 2):
    - a float32 x is a normal float64 (no `tiny` scaling), and sqrt(x) >= 2^-75 rounds to a normal
      float32, so both reduce to X in [1, 4) by the same exact power of two;
    - sqrt(X) is never within 2^-50 (four float64 ulps) of a float32 rounding boundary: X has at
      most 24 significant bits, so X = m 2^-46 (m an integer), and for a midpoint c = (2n + 1)
      2^-24 between two float32 values, X - c^2 = (4m - (2n + 1)^2) 2^-48 is an odd multiple
      of 2^-48, so |sqrt(X) - c| = |X - c^2| / (sqrt(X) + c) > 2^-48 / 4; the Newton value
      (before the correction) is within a float64 ulp or two of sqrt(X), so it rounds to the same
      float32 as the nearest double does;
    - bench/portable.py --sqrt32 checks that claim for every one of the 2^24 values of X a float32
      can give (each mantissa, both exponent parities), and the specials (0, -0, inf, NaN, < 0)
      take the same `where`s as sqrt64."""
    return _reduced_sqrt(x.to(torch.float64), _newton_sqrt, subnormal=False).to(torch.float32)


# ----------------------------------------------------------------------- fp32 and friends


def exp(x: torch.Tensor) -> torch.Tensor:
    """e^x in x's dtype: float64 evaluation, rounded once."""
    return exp64(x).to(x.dtype)


def log(x: torch.Tensor) -> torch.Tensor:
    """ln x in x's dtype: float64 evaluation, rounded once."""
    return log64(x).to(x.dtype)


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    """1 / (1 + e^-x) in x's dtype, evaluated in float64 and rounded once."""
    return torch.div(1.0, torch.add(exp64(torch.neg(x.to(torch.float64))), 1.0)).to(x.dtype)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """e^(x - max) / tree_sum(e^(x - max)), in x's dtype. A row of all -inf gives NaN."""
    m = x.amax(dim=dim, keepdim=True)
    e = exp(torch.sub(x, m))
    return torch.div(e, tree_sum(e, dim, keepdim=True))


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """(x - max) - ln(tree_sum(e^(x - max))), in x's dtype."""
    m = x.amax(dim=dim, keepdim=True)
    shifted = torch.sub(x, m)
    return torch.sub(shifted, log(tree_sum(exp(shifted), dim, keepdim=True)))


def scalar_log(v: float) -> float:
    """ln of a Python float, through log64 (libm's log is not the same function on every CPU)."""
    return float(log64(torch.tensor([v], dtype=torch.float64))[0])


_NORMAL_CHUNK = 1 << 20            # pairs drawn per torch.rand call: part of the definition


def normal(shape, generator: torch.Generator, dtype: torch.dtype = torch.float32,
           device: str | torch.device = "cpu") -> torch.Tensor:
    """Standard normal samples by Box-Muller from torch.rand's float64 uniforms (integer-exact
    draws from the CPU generator) and the float64 kernels above; torch.randn is not portable.
    Uniforms are drawn _NORMAL_CHUNK pairs at a time (u1, u2 interleaved), so memory stays
    bounded for real-size weights and the values never depend on anything but the generator.
    `device`: where the float64 arithmetic runs and the result lives (the same bits anywhere)."""
    n = math.prod(shape)
    out = torch.empty(n, dtype=dtype, device=device)
    for start in range(0, n, 2 * _NORMAL_CHUNK):
        count = min(n - start, 2 * _NORMAL_CHUNK)
        u = torch.rand(2 * ((count + 1) // 2), generator=generator, dtype=torch.float64).to(device)
        u1, u2 = u[0::2], u[1::2]
        radius = sqrt64(torch.mul(log64(torch.sub(1.0, u1)), -2.0))         # 1 - u1 in (0, 1]
        sin, cos = sincos64(torch.mul(u2, 2.0 * math.pi))
        out[start:start + count] = torch.cat([torch.mul(radius, cos), torch.mul(radius, sin)])[:count].to(dtype)
    return out.reshape(shape)


def running_sum(x: torch.Tensor) -> torch.Tensor:
    """Left-to-right running sum of a 1-D tensor, in float64: s[i] = s[i - 1] + x[i]. torch's CPU
    cumsum is that sequential loop in float64 on every CPU (tests/test_portable.py checks it
    against Python's own left-to-right sum); other devices scan in another order, so the sum
    is taken on the CPU and the result moved back."""
    return torch.cumsum(x.detach().to("cpu", torch.float64), dim=0).to(x.device)
