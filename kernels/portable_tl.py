"""lockstep.kernels.portable's float64 exp and log, as Triton device functions.

In Triton's interpreter `tl.exp`, `tl.log` and `tl.sigmoid` are numpy's, and numpy picks an
AVX2, AVX-512 or baseline implementation of them at run time, with different last bits (run
with NPY_DISABLE_CPU_FEATURES="X86_V3" to see it). So a kernel run in the interpreter takes
these instead: the same range reductions and polynomials as kernels/portable.py, step by
step the same IEEE operations (numpy evaluates each one separately: no FMA), so in the
interpreter they give exactly kernels.portable's bits. Compiled on a GPU, a kernel passes
PORTABLE=False and uses the hardware's own functions: those bits are fixed by the GPU
architecture and the Triton version, both recorded in a golden's provenance.
"""

from lockstep.kernels import _common  # noqa: F401  (first: it sets TRITON_INTERPRET before triton is imported)
import triton
import triton.language as tl

_LN2_HI = tl.constexpr(6.93147180369123816490e-01)
_LN2_LO = tl.constexpr(1.90821492927058770002e-10)
_INV_LN2 = tl.constexpr(1.44269504088896338700e+00)
_SQRT2 = tl.constexpr(1.41421356237309514547e+00)


@triton.jit
def _c(v: tl.constexpr):
    """A float64 constant made as float64 (an older Triton may round a bare Python float to fp32
    before promoting it, which would change these polynomials' bits on the GPU)."""
    return tl.full((), v, tl.float64)


@triton.jit
def _pow2(k):
    """2.0 ** k for int64 k in [-1022, 1023], from its bits."""
    return ((k + 1023) << 52).to(tl.float64, bitcast=True)


@triton.jit
def exp64(x):
    """e^x, float64 in and out (kernels.portable.exp64, step for step)."""
    x = x.to(tl.float64)
    xc = tl.minimum(tl.maximum(x, -_c(746.0)), _c(710.0))
    k = tl.floor(xc * _c(_INV_LN2) + _c(0.5))
    r = (xc - k * _c(_LN2_HI)) - k * _c(_LN2_LO)
    p = _c(1.0 / 6227020800.0)                       # 1/13!, then Horner down to 1/0!
    p = p * r + _c(1.0 / 479001600.0)
    p = p * r + _c(1.0 / 39916800.0)
    p = p * r + _c(1.0 / 3628800.0)
    p = p * r + _c(1.0 / 362880.0)
    p = p * r + _c(1.0 / 40320.0)
    p = p * r + _c(1.0 / 5040.0)
    p = p * r + _c(1.0 / 720.0)
    p = p * r + _c(1.0 / 120.0)
    p = p * r + _c(1.0 / 24.0)
    p = p * r + _c(1.0 / 6.0)
    p = p * r + _c(0.5)
    p = p * r + _c(1.0)
    p = p * r + _c(1.0)
    ki = k.to(tl.int64)
    k1 = ki >> 1                                 # floor(k / 2)
    y = (p * _pow2(k1)) * _pow2(ki - k1)
    y = tl.where(x > _c(709.782712893384), float("inf"), y)
    y = tl.where(x < -_c(745.2), _c(0.0), y)
    return tl.where(x != x, x, y)


@triton.jit
def log64(x):
    """ln x, float64 in and out (kernels.portable.log64, step for step)."""
    x = x.to(tl.float64)
    tiny = x < _c(2.2250738585072014e-308)
    xs = tl.where(tiny, x * _c(18446744073709551616.0), x)
    bits = xs.to(tl.int64, bitcast=True)
    e = ((bits >> 52) & 0x7FF) - 1023 - tl.where(tiny, 64, 0)
    m = ((bits & 0xFFFFFFFFFFFFF) | (1023 << 52)).to(tl.float64, bitcast=True)
    big = m > _c(_SQRT2)
    m = tl.where(big, m * _c(0.5), m)
    e = e + big.to(tl.int64)
    f = m - _c(1.0)
    s = f / (f + _c(2.0))
    s2 = s * s
    q = _c(2.0 / 23.0)                               # 2/(2i+1) for i = 11 .. 0, Horner in s^2
    q = q * s2 + _c(2.0 / 21.0)
    q = q * s2 + _c(2.0 / 19.0)
    q = q * s2 + _c(2.0 / 17.0)
    q = q * s2 + _c(2.0 / 15.0)
    q = q * s2 + _c(2.0 / 13.0)
    q = q * s2 + _c(2.0 / 11.0)
    q = q * s2 + _c(2.0 / 9.0)
    q = q * s2 + _c(2.0 / 7.0)
    q = q * s2 + _c(2.0 / 5.0)
    q = q * s2 + _c(2.0 / 3.0)
    q = q * s2 + _c(2.0)
    log_m = s * q
    ef = e.to(tl.float64)
    y = ef * _c(_LN2_HI) + (ef * _c(_LN2_LO) + log_m)
    y = tl.where(x == _c(0.0), float("-inf"), y)
    y = tl.where(x == float("inf"), float("inf"), y)
    return tl.where((x < _c(0.0)) | (x != x), float("nan"), y)


@triton.jit
def exp_f32(x, PORTABLE: tl.constexpr):
    """e^x for fp32 x: exp64 rounded once when PORTABLE, else the hardware's exp."""
    if PORTABLE:
        return exp64(x).to(tl.float32)
    else:
        return tl.exp(x)


@triton.jit
def sigmoid_f32(x, PORTABLE: tl.constexpr):
    """1 / (1 + e^-x) for fp32 x: in float64 and rounded once when PORTABLE."""
    if PORTABLE:
        return (1.0 / (exp64(-(x.to(tl.float64))) + 1.0)).to(tl.float32)
    else:
        return tl.sigmoid(x)


@triton.jit
def log_f64(x, PORTABLE: tl.constexpr):
    """ln x for float64 x: log64 when PORTABLE, else the hardware's log."""
    if PORTABLE:
        return log64(x)
    else:
        return tl.log(x)


@triton.jit
def cast_rne(x, DTYPE: tl.constexpr):
    """fp32 x -> DTYPE for a store. To bf16 it rounds to nearest, ties to even, from the bits:
    compiled kernels round that way anyway, but Triton's interpreter truncates (measured: half of
    4096 random values came out one bf16 ulp off torch's `.to(torch.bfloat16)`), so every bf16
    result the engine stores goes through here and the interpreter, the GPU and torch agree.
    NaN stays a (quiet) NaN; a value that rounds past the largest bf16 becomes inf, as in torch."""
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = tl.where(x != x, (bits >> 16) | 0x40, rounded)
        return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(DTYPE)
