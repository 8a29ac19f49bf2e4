"""The IEEE oracle: every torch op the CPU reference relies on, checked against arithmetic that
cannot depend on the machine (DESIGN §2, D0).

The portable path (kernels/portable.py, the engine's torch backend) claims its bits follow from
IEEE 754 alone. That holds only if each torch op it calls IS a single correctly rounded IEEE
operation (or an exact one) on this CPU, in the vector body and in the scalar tail alike. This
module checks each one against an oracle:
- float64 results: Python's own float arithmetic (one IEEE operation per element);
- float32 results of + - * / and sqrt: the float64 result rounded to float32 by integer
  emulation (round to nearest even on the bits, subnormals kept); rounding twice is harmless
  here because 53 >= 2 * 24 + 2;
- bf16 casts: round to nearest even on the float32 bits, emulated with integers;
- exact ops (comparisons, where, min/max, floor/round, sort, argmax, the running sum): Python.
Each op's Python definition is applied in bulk through numpy's float64 operations and integer
emulation, held to the definition element by element on a sample (`_held_to_python`, below).

Inputs mix special values (+-0, +-inf, NaNs with payloads, subnormals, the extremes, halfway
cases) with random bit patterns over every exponent and ordinary values; each op also runs on
slices of 1..67 elements so the scalar tails of the vector loops are checked as well.

`lockstep doctor` runs `check_all(n)` and prints the ops that are not IEEE here;
tests/test_primitive_oracle.py runs it with 10^6 inputs per op. `REFERENCE_OPS` is the closed
list of aten ops the reference may call (tests/test_primitive_oracle.py holds the engine to it).
"""

from __future__ import annotations

import functools
import itertools
import math
import struct
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from lockstep.kernels import portable

# The aten ops the CPU reference may call: single IEEE operations, each checked below, and ops
# that compute nothing but move, view, compare or pick values. torch's sqrt, exp, log, sigmoid,
# pow, sum, mean, softmax, matmul, ... are not here on purpose: they follow the CPU.
CHECKED_OPS = frozenset({
    "add", "add_", "sub", "rsub", "mul", "div", "reciprocal", "neg", "abs",
    "_to_copy", "to", "copy_",
    "floor", "round", "clamp", "maximum", "amax", "where", "nextafter", "nan_to_num",
    "eq", "ne", "lt", "le", "gt", "ge", "isnan", "isfinite",
    "sort", "argmax", "cumsum",
})
MOVING_OPS = frozenset({
    "alias", "arange", "cat", "chunk", "clone", "detach", "empty", "empty_like", "expand",
    "full", "full_like", "index_put_", "index_select", "item", "lift_fresh", "narrow", "new_empty",
    "new_zeros", "ones", "ones_like", "permute", "repeat_interleave", "reshape", "scalar_tensor",
    "select", "set_", "slice", "split", "split_with_sizes", "squeeze", "stack", "transpose",
    "unbind", "unsqueeze", "view", "zeros", "zeros_like", "_local_scalar_dense", "any", "nonzero",
    "rand", "randint",          # integer-exact draws from a torch.Generator (no float math)
    # integer and bit ops (exact on integers)
    "__and__", "__or__", "__lshift__", "__rshift__", "bitwise_and", "bitwise_and_",
    "bitwise_or", "bitwise_xor", "bitwise_not", "logical_and", "logical_or", "logical_not",
    "remainder", "floor_divide", "argsort", "topk", "gather", "index", "masked_fill",
    "index_copy", "index_copy_", "scatter_", "all", "amin",    # moves, a boolean and, a min (exact)
    "sum.integer",              # sums of ints and bools (counts): exact in any order; float sums are not here
})
REFERENCE_OPS = CHECKED_OPS | MOVING_OPS


# ------------------------------------------------------------------ integer-exact rounding

def round_to_f32(x: np.ndarray) -> np.ndarray:
    """float64 values rounded to the nearest float32 (ties to even, subnormals kept, overflow to
    inf), returned as float64, computed with integer operations only. NaN stays NaN."""
    if x.dtype != np.float64:
        raise TypeError(f"round_to_f32 takes float64 values, got {x.dtype}")
    b = x.view(np.uint64)
    sign = (b >> np.uint64(63)).astype(bool)
    E = ((b >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64)
    M = (b & np.uint64((1 << 52) - 1)).astype(np.int64)
    m = np.where(E > 0, M | (1 << 52), M)                          # value = m * 2^e2
    e2 = np.where(E > 0, E - 1075, -1074)
    top = np.full_like(m, 52)                                       # bit length of m, minus one:
    sub = np.flatnonzero(E == 0)                                    # 52 but for subnormals and 0
    if sub.size:
        ms, ts = m[sub], np.zeros(sub.size, dtype=np.int64)
        for s in (32, 16, 8, 4, 2, 1):
            big = (ms >> (ts + s)) > 0
            ts = np.where(big, ts + s, ts)
        top[sub] = ts
    lsb = np.maximum(e2 + top - 23, -149)                           # float32's ulp at this value
    d = lsb - e2                                                    # bits to drop (>= 29 here)
    safe_d = np.clip(d, 1, 62)
    q = m >> safe_d
    r = m - (q << safe_d)
    half = np.int64(1) << (safe_d - 1)
    q = q + ((r > half) | ((r == half) & ((q & 1) == 1)))
    q = np.where(d > 62, 0, q)
    with np.errstate(over="ignore"):                                # inf past float64: mapped to inf below
        v = np.ldexp(q.astype(np.float64), lsb)                     # exact: q < 2^25
    v = np.where(v >= 2.0 ** 128, np.inf, v)
    v = np.where(sign, -v, v)
    v = np.where(E == 0x7FF, x, v)                                  # inf and NaN pass through
    return v


def bf16_bits(f32_bits: np.ndarray) -> np.ndarray:
    """float32 bit patterns -> bf16 bit patterns, round to nearest even; a NaN keeps its sign
    and top payload bits, made quiet (rounding would carry it into the sign or an infinity)."""
    b = f32_bits.astype(np.uint64)
    rounded = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF
    nan = ((b & 0x7F800000) == 0x7F800000) & ((b & 0x7FFFFF) != 0)
    return np.where(nan, (b >> 16) | 0x40, rounded).astype(np.uint32)


# ------------------------------------------------------------------------------- inputs

_SPECIAL64 = [0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 5e-324, -5e-324,
              2.2250738585072014e-308, 2.225073858507201e-308, 1.7976931348623157e308, 1.0, -1.0,
              0.5, 1.5, 2.0, 3.0, 1.0000000000000002, 0.9999999999999999, 1e-300, 1e300]
_SPECIAL32 = [1.401298464324817e-45, 1.1754943508222875e-38, 1.1754942106924411e-38,
              3.4028234663852886e38, 3.4028235677973366e38, 1.0000001192092896, 0.99999994039535522,
              16777216.0, 16777217.0, 8388608.5, 0.1, 1e-5]


def inputs(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """n values of dtype: specials and halfway cases, random bit patterns, ordinary values."""
    with np.errstate(all="ignore"):
        return _inputs(n, dtype, seed)


def _inputs(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = np.random.default_rng(seed)
    special = np.array(_SPECIAL64 + _SPECIAL32 + [-v for v in _SPECIAL32], dtype=np.float64)
    if dtype == torch.float32:
        rand_bits = g.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
        # halfway between adjacent bf16 values, and float32 values a hair either side
        halfway = (g.integers(0, 2 ** 16, n // 8, dtype=np.uint64).astype(np.uint32) << 16 | 0x8000)
        halfway = halfway.view(np.float32)
        ordinary = (g.standard_normal(n // 4) * 4.0).astype(np.float32)
        subnormal = g.integers(1, 1 << 23, n // 16, dtype=np.uint64).astype(np.uint32).view(np.float32)
        vals = np.concatenate([special.astype(np.float32), halfway, ordinary, subnormal, rand_bits])
    else:
        rand_bits = g.integers(0, 2 ** 63, n, dtype=np.int64) ^ (g.integers(0, 2, n, dtype=np.int64) << 63)
        rand_bits = rand_bits.view(np.float64)
        f32 = g.integers(0, 2 ** 32, n // 8, dtype=np.uint64).astype(np.uint32).view(np.float32).astype(np.float64)
        ulp = np.abs(f32) * 2.0 ** -24                              # about half a float32 ulp
        halfway = f32 + np.where(g.integers(0, 2, n // 8) == 1, ulp, -ulp)
        ordinary = g.standard_normal(n // 4) * 4.0
        subnormal = g.integers(1, 1 << 52, n // 16, dtype=np.int64).view(np.float64)
        vals = np.concatenate([special, f32, halfway, ordinary, subnormal, rand_bits])
    return torch.from_numpy(vals[:n].copy() if len(vals) >= n else vals.copy())


def tail_lengths(n: int) -> list[int]:
    """1, 2, ..., 67, 1, 2, ... summing to n (the last one cut short)."""
    out, done, length = [], 0, 1
    while done < n:
        out.append(min(length, n - done))
        done, length = done + out[-1], length % 67 + 1
    return out


def tails(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
    """fn applied to slices of 1, 2, ..., 67, 1, 2, ... elements, concatenated: every length of
    scalar tail a vector loop can leave (AVX-512 holds 16 floats or 8 doubles). The slices are
    views of the arguments (torch.split), each its own call of fn."""
    return torch.cat([fn(*parts) for parts in zip(*(_slices(a) for a in args))])


def tails_sampled(fn: Callable[[torch.Tensor], torch.Tensor], a: torch.Tensor, every: int = 16) -> torch.Tensor:
    """fn(a), with every `every`-th element (from every part of `inputs`' mix) computed by `tails`
    (each scalar-tail length many times over) and the rest in one call: for an op composed of ops
    that `tails` checks on every input."""
    picked = torch.zeros(a.numel(), dtype=torch.bool)
    picked[::every] = True
    out = torch.empty_like(a)
    out[picked] = tails(fn, a[picked].contiguous())
    out[~picked] = fn(a[~picked].contiguous())
    return out


_SLICED: list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = []


def _slices(a: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """a.split(tail_lengths(a.numel())), the same views for the same tensor: each check passes its
    inputs to many ops, and splitting 10^6 elements into ~29,000 views costs about as much as an
    op's calls on them. The last few tensors are kept (held, so no other tensor takes their id)."""
    for t, parts in _SLICED:
        if t is a:
            return parts
    parts = a.split(tail_lengths(a.numel()))
    _SLICED[:] = [(a, parts)] + _SLICED[:3]
    return parts


# ------------------------------------------------------------------------------- checks

@dataclass
class Finding:
    op: str
    checked: int
    wrong: int
    example: str = ""

    @property
    def ok(self) -> bool:
        return self.wrong == 0


def _same(got: torch.Tensor, want: np.ndarray) -> np.ndarray:
    """Bitwise equal, any NaN matching any NaN (payloads are not IEEE-defined for results)."""
    g = got.numpy()
    if g.dtype.kind == "f":
        bits_equal = g.view(np.uint64 if g.itemsize == 8 else np.uint32) == \
            want.astype(g.dtype).view(np.uint64 if g.itemsize == 8 else np.uint32)
        return bits_equal | (np.isnan(g) & np.isnan(want))
    return g == want


def _finding(op: str, got: torch.Tensor, want: np.ndarray, args) -> Finding:
    ok = _same(got, want)
    wrong = int((~ok).sum())
    example = ""
    if wrong:
        i = int(np.argmin(ok))
        example = (f"at {[float(a.reshape(-1)[i]) for a in args]}: got {got.reshape(-1)[i].item()!r}, "
                   f"IEEE {want.reshape(-1)[i].item()!r}")
    return Finding(op, got.numel(), wrong, example)


# ------------------------------------------------------------- the expected values, in bulk
#
# Each op's meaning is a Python function of one element (or one row): `_py_div`, `_py_floor`, the
# lambdas below, ... These are the oracle. Applying them to 10^6 elements in Python took tens of
# seconds, so the expectations are computed in bulk with numpy, and `_held_to_python` holds every
# bulk result to its Python definition on a sample of the inputs (every `_STRIDE`-th element and
# the special values at the front), raising OracleDisagrees if they part.
#
# Why the bulk results are the Python ones: numpy's float64 add, subtract, multiply, divide and
# sqrt are each one IEEE 754 operation per element (correctly rounded, no fused or approximate
# steps), the very operation Python's float `+ - * /` and math.sqrt perform; the exact operations
# (comparisons, floor, rint, nextafter, selections) have one right answer. Float32 results are the
# float64 result rounded to float32 with integers (round_to_f32), as before: rounding twice is
# harmless for + - * / and sqrt of float32 operands because 53 >= 2 * 24 + 2 (Figueroa, "When is
# double rounding innocuous?", 1995). Conversions are emulated with integers (floats made only from
# integers below 2^32, exact in any implementation; int64 -> float64 rounded by one IEEE add), so
# they do not rest on the rounding of the conversion instructions torch's own casts use.

_STRIDE = 64          # the self-check's sample: 15,688 of 10^6 elements, the specials included


class OracleDisagrees(AssertionError):
    """The bulk expectations left their Python definition: the oracle itself cannot be trusted."""


@functools.lru_cache(maxsize=8)
def _sample(n: int) -> np.ndarray:
    """The sampled indices (every check of n elements takes the same ones: computed once)."""
    idx = np.unique(np.concatenate([np.arange(min(n, 64)), np.arange(0, n, _STRIDE)]))
    idx.flags.writeable = False
    return idx


def _equal(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Bitwise equal floats (any NaN matching any NaN), or equal values of any other dtype."""
    if x.dtype.kind == "f":
        x, y = x.astype(np.float64), y.astype(np.float64)
        return (x.view(np.uint64) == y.view(np.uint64)) | (np.isnan(x) & np.isnan(y))
    return x == y


def _held_to_python(op: str, want: np.ndarray, py: Callable, *cols) -> np.ndarray:
    """want (the bulk expectation of `op`), checked against py applied element by element (row by
    row for 2-d columns) to the sampled entries of cols; returned as it is."""
    idx = _sample(len(want))
    picked = [c[idx].tolist() for c in cols]            # Python floats, bools, ints (or lists)
    py_vals = np.array([py(*args) for args in zip(*picked)], dtype=want.dtype)
    same = _equal(want[idx], py_vals)
    if same.ndim > 1:
        same = same.all(axis=tuple(range(1, same.ndim)))
    if not same.all():
        i = int(np.argmin(same))
        raise OracleDisagrees(f"{op}: the bulk oracle gives {want[idx][i]!r}, Python {py_vals[i]!r} "
                              f"at {[c[idx][i] for c in cols]}")
    return want


def exact_f64(t: torch.Tensor) -> np.ndarray:
    """The exact values of a float32 or float64 tensor as float64, float32 widened with integers
    (subnormals included; NaNs stay NaN)."""
    if t.dtype == torch.float64:
        return t.numpy().copy()
    bits = t.view(torch.int32).numpy().view(np.uint32).astype(np.int64)
    E, M = (bits >> 23) & 0xFF, bits & ((1 << 23) - 1)
    m = np.where(E > 0, M | (1 << 23), M)                          # value = m * 2^(e - 150)
    v = np.ldexp(m.astype(np.float64), np.where(E > 0, E - 150, -149))    # exact: m < 2^24
    v = np.where(E == 0xFF, np.where(M == 0, np.inf, np.nan), v)
    return np.where(bits >> 31 == 1, -v, v)


def int_to_f64(v: np.ndarray) -> np.ndarray:
    """int64 values rounded to the nearest float64 (ties to even): v = hi * 2^32 + lo with both
    parts exact in float64, so the one IEEE add that joins them rounds the integer once."""
    hi, lo = v >> 32, v & 0xFFFFFFFF                                # |hi| <= 2^31, 0 <= lo < 2^32
    return np.ldexp(hi.astype(np.float64), 32) + lo.astype(np.float64)


def integral_f64_to_int(x: np.ndarray) -> np.ndarray:
    """Integral float64 values (|x| < 2^63) as int64, read off their bits."""
    b = x.view(np.uint64)
    E = ((b >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64)
    M = (b & np.uint64((1 << 52) - 1)).astype(np.int64)
    m = np.where(E > 0, M | (1 << 52), M)                          # value = m * 2^(E - 1075)
    shift = E - 1075
    mag = np.where(shift >= 0, m << np.clip(shift, 0, 10), m >> np.clip(-shift, 0, 63))
    mag = np.where(E == 0, 0, mag)
    return np.where((b >> np.uint64(63)) == 1, -mag, mag)


def _py_div(a: float, b: float) -> float:
    if b == 0.0:
        if a == 0.0 or a != a:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


# each op: (torch's, its Python definition, numpy's float64 operation)
_BINARY = {"add": (torch.add, lambda a, b: a + b, np.add), "sub": (torch.sub, lambda a, b: a - b, np.subtract),
           "mul": (torch.mul, lambda a, b: a * b, np.multiply), "div": (torch.div, _py_div, np.divide)}


def _ieee(values: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """float64 results as the dtype rounds them (float32: once more, with integers)."""
    return round_to_f32(values) if dtype == torch.float32 else values


def check_binary(n: int, dtype: torch.dtype) -> list[Finding]:
    out = []
    a, b = inputs(n, dtype, 1), inputs(n, dtype, 2)[torch.randperm(n, generator=torch.Generator().manual_seed(3))]
    x, y = exact_f64(a), exact_f64(b)
    name = "f32" if dtype == torch.float32 else "f64"
    for op, (t_fn, py, bulk) in _BINARY.items():
        want = _ieee(_held_to_python(op, bulk(x, y), py, x, y), dtype)
        out.append(_finding(f"{op} {name}", t_fn(a, b), want, (a, b)))
        out.append(_finding(f"{op} {name} (tails)", tails(t_fn, a, b), want, (a, b)))
        for s in (0.5, 3.0, 1e-5, -7.0, 2880):                     # tensor op Python scalar
            sv = float(torch.tensor(s, dtype=dtype))                # the scalar as the dtype holds it
            want_s = _ieee(_held_to_python(f"{op} {sv}", bulk(x, sv), lambda v, sv=sv: py(v, sv), x), dtype)
            out.append(_finding(f"{op} {name} scalar {s}", t_fn(a, s), want_s, (a,)))
    want = _ieee(_held_to_python("reciprocal", np.divide(1.0, x), lambda v: _py_div(1.0, v), x), dtype)
    out.append(_finding(f"reciprocal {name}", tails(torch.reciprocal, a), want, (a,)))
    want = _ieee(_held_to_python("rsub 1", np.subtract(1.0, x), lambda v: 1.0 - v, x), dtype)
    out.append(_finding(f"rsub {name} 1", tails(lambda t: torch.rsub(t, 1), a), want, (a,)))
    out.append(_finding(f"neg {name}", tails(torch.neg, a), _held_to_python("neg", -x, lambda v: -v, x), (a,)))
    out.append(_finding(f"abs {name}", tails(torch.abs, a), _held_to_python("abs", np.abs(x), abs, x), (a,)))
    return out


def _py_sqrt(x: float) -> float:
    return math.sqrt(x) if x >= 0 else math.nan


def _sqrt_want(a: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    x = exact_f64(a)
    with np.errstate(invalid="ignore"):                             # negatives: NaN, as _py_sqrt
        return _ieee(_held_to_python("sqrt", np.sqrt(x), _py_sqrt, x), dtype)


def check_sqrt(n: int, dtype: torch.dtype) -> list[Finding]:
    """portable.sqrt, correctly rounded on every input, a sixteenth of them through `tails` (every
    scalar-tail length ~57 times at 10^6 inputs). It is ~110 elementwise ops, each checked on its
    own at every tail length on every input; all 10^6 inputs through `tails` (58,826 calls) were
    22 of the oracle's 34 CPU seconds on a 2-core AMD EPYC, a sixteenth 1.5."""
    a = inputs(n, dtype, 4)
    name = "f32" if dtype == torch.float32 else "f64"
    return [_finding(f"portable.sqrt {name}", tails_sampled(portable.sqrt, a), _sqrt_want(a, dtype), (a,))]


def check_torch_sqrt(n: int, dtype: torch.dtype) -> Finding:
    """torch's own sqrt, for `doctor` to show (the reference does not call it)."""
    a = inputs(n, dtype, 4).abs()
    return _finding(f"torch.sqrt {'f32' if dtype == torch.float32 else 'f64'} (not used)", torch.sqrt(a),
                    _sqrt_want(a, dtype), (a,))


def check_casts(n: int) -> list[Finding]:
    out = []
    a64 = inputs(n, torch.float64, 5)
    out.append(_finding("cast f64->f32", tails(lambda t: t.to(torch.float32), a64), round_to_f32(a64.numpy()), (a64,)))
    a32 = inputs(n, torch.float32, 6)
    bits = a32.view(torch.int32).numpy().view(np.uint32)
    widened = _held_to_python("f32->f64", exact_f64(a32), lambda b: struct.unpack("<f", struct.pack("<I", b))[0], bits)
    out.append(_finding("cast f32->f64", tails(lambda t: t.to(torch.float64), a32), widened, (a32,)))
    got = tails(lambda t: t.to(torch.bfloat16), a32).view(torch.int16).numpy().view(np.uint16).astype(np.uint32)
    want = bf16_bits(bits)
    nan = np.isnan(a32.numpy())
    ok = (got == want) | (nan & ((got & 0x7F80) == 0x7F80) & ((got & 0x7F) != 0))
    out.append(Finding("cast f32->bf16", n, int((~ok).sum())))
    back = torch.from_numpy(want.astype(np.uint16).view(np.int16)).view(torch.bfloat16)     # the bits as they are
    widened = tails(lambda t: t.to(torch.float32), back).view(torch.int32).numpy().view(np.uint32)
    nan16 = ((want & 0x7F80) == 0x7F80) & ((want & 0x7F) != 0)
    wrong = ((widened >> 16) != want) | ((widened & 0xFFFF) != 0)
    wrong &= ~(nan16 & np.isnan(widened.view(np.float32)))      # a NaN may come back quieted
    out.append(Finding("cast bf16->f32", n, int(wrong.sum())))
    ints = torch.from_numpy(np.random.default_rng(7).integers(-2 ** 62, 2 ** 62, n, dtype=np.int64))
    ints[: n // 2] >>= 20
    as_f64 = _held_to_python("i64->f64", int_to_f64(ints.numpy()), float, ints.numpy())
    out.append(_finding("cast i64->f64", tails(lambda t: t.to(torch.float64), ints), as_f64, (ints,)))
    out.append(_finding("cast i64->f32", tails(lambda t: t.to(torch.float32), ints), round_to_f32(as_f64), (ints,)))
    whole = torch.floor(a64.clamp(-2.0 ** 62, 2.0 ** 62))
    whole = torch.where(torch.isnan(whole), 0.0, whole)
    as_int = _held_to_python("f64->i64", integral_f64_to_int(whole.numpy()), int, whole.numpy())
    out.append(_finding("cast f64->i64 (integral values)", tails(lambda t: t.to(torch.int64), whole), as_int, (whole,)))
    return out


def _py_floor(x: float) -> float:
    return x if (x != x or math.isinf(x) or x == int(x)) else float(math.floor(x))


def _py_round(x: float) -> float:
    if x != x or math.isinf(x) or x == int(x):
        return x
    return math.copysign(float(round(x)), x)


def _py_clamp(x: float, lo: float | None, hi: float | None) -> float:
    if x != x:
        return x
    if lo is not None and x < lo:
        x = lo
    if hi is not None and x > hi:
        x = hi
    return x


def _clamp(x: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
    """_py_clamp in bulk: comparisons and selections only (a NaN fails both, so stays)."""
    if lo is not None:
        x = np.where(x < lo, np.float64(lo), x)
    if hi is not None:
        x = np.where(x > hi, np.float64(hi), x)
    return x


def _py_max(a: float, b: float) -> float:
    if a != a or b != b:
        return math.nan
    return a if a > b else b if b > a else a        # equal values (+0 and -0 included): the first


_COMPARISONS = (("eq", lambda x, y: x == y, np.equal), ("ne", lambda x, y: x != y, np.not_equal),
                ("lt", lambda x, y: x < y, np.less), ("le", lambda x, y: x <= y, np.less_equal),
                ("gt", lambda x, y: x > y, np.greater), ("ge", lambda x, y: x >= y, np.greater_equal))


def check_exact(n: int, dtype: torch.dtype) -> list[Finding]:
    out = []
    name = "f32" if dtype == torch.float32 else "f64"
    a, b = inputs(n, dtype, 8), inputs(n, dtype, 9)
    x, y = exact_f64(a), exact_f64(b)
    held = _held_to_python
    out.append(_finding(f"floor {name}", tails(torch.floor, a), held("floor", np.floor(x), _py_floor, x), (a,)))
    out.append(_finding(f"round {name}", tails(torch.round, a), held("round", np.rint(x), _py_round, x), (a,)))
    for lo, hi in ((-7.0, 7.0), (None, 7.0), (-745.0, 709.0), (0, 1)):
        got = tails(lambda t: torch.clamp(t, lo, hi), a)
        want = held(f"clamp [{lo}, {hi}]", _clamp(x, lo, hi), lambda v: _py_clamp(v, lo, hi), x)
        out.append(_finding(f"clamp {name} [{lo}, {hi}]", got, want, (a,)))
    either_nan = np.isnan(x) | np.isnan(y)
    want = held("maximum", np.where(either_nan, np.nan, np.where(y > x, y, x)), _py_max, x, y)
    out.append(_finding(f"maximum {name}", tails(torch.maximum, a, b), want, (a, b)))
    for op, py, bulk in _COMPARISONS:
        out.append(_finding(f"{op} {name}", tails(getattr(torch, op), a, b), held(op, bulk(x, y), py, x, y), (a, b)))
    want = held("isnan", np.isnan(x), lambda v: v != v, x)
    out.append(_finding(f"isnan {name}", tails(torch.isnan, a), want, (a,)))
    want = held("isfinite", np.isfinite(x), math.isfinite, x)
    out.append(_finding(f"isfinite {name}", tails(torch.isfinite, a), want, (a,)))
    cond = a > b
    c = cond.numpy()
    want = held("where", np.where(c, x, y), lambda k, v, w: v if k else w, c, x, y)
    out.append(_finding(f"where {name}", tails(torch.where, cond, a, b), want, (a, b)))
    toward = torch.where(torch.rand(n, generator=torch.Generator().manual_seed(10)) < 0.5, math.inf, -math.inf).to(dtype)
    if dtype == torch.float64:
        want = held("nextafter", np.nextafter(x, toward.numpy()), math.nextafter, x, toward.numpy())
    else:
        want = np.nextafter(a.numpy(), toward.numpy())             # numpy's float32 nextafter, as before
    out.append(_finding(f"nextafter {name}", tails(torch.nextafter, a, toward), want, (a, toward)))
    return out


def _py_amax(r: list[float]) -> float:
    if any(v != v for v in r):
        return math.nan
    m = max(r)
    return m if m != 0 else (0.0 if any(v == 0 and math.copysign(1, v) > 0 for v in r) else -0.0)


def _py_argmax(r: list[float]) -> int:
    nan = [i for i, v in enumerate(r) if v != v]
    return nan[0] if nan else max(range(len(r)), key=lambda i: (r[i], -i))


def _py_sorted(r: list[float], desc: bool) -> list[int]:
    def key(i):
        v = r[i]
        if v != v:                       # NaN sorts above every value
            return (1, 0.0, i) if not desc else (0, 0.0, i)
        return (0, v, i) if not desc else (1, -v, i)
    return sorted(range(len(r)), key=key)


def _order_key(x: np.ndarray) -> np.ndarray:
    """int64 keys in the order of float64 values, +0 and -0 one key (NaNs: any key, masked by
    the callers)."""
    b = np.where(x == 0, 0.0, x).view(np.int64)
    return np.where(b < 0, b ^ np.int64(0x7FFFFFFFFFFFFFFF), b)


def _bulk_amax(rows: np.ndarray) -> np.ndarray:
    nan = np.isnan(rows).any(axis=1)
    key = np.where(np.isnan(rows), np.iinfo(np.int64).min, _order_key(rows))
    m = np.take_along_axis(rows, key.argmax(axis=1)[:, None], axis=1)[:, 0]
    positive_zero = ((rows == 0) & ~np.signbit(rows)).any(axis=1)
    m = np.where(m == 0, np.where(positive_zero, 0.0, -0.0), m)
    return np.where(nan, np.nan, m)


def _bulk_argmax(rows: np.ndarray) -> np.ndarray:
    nan = np.isnan(rows)
    key = np.where(nan, np.iinfo(np.int64).min, _order_key(rows))
    first_max = (key == key.max(axis=1, keepdims=True)).argmax(axis=1)      # argmax: the first True
    return np.where(nan.any(axis=1), nan.argmax(axis=1), first_max)


def _bulk_sorted(rows: np.ndarray, desc: bool) -> np.ndarray:
    nan = np.isnan(rows)
    key = np.where(nan, 0, _order_key(rows))
    group = nan if not desc else ~nan                       # ascending: NaNs last; descending: first
    if desc:
        key = -key                                          # no overflow: |key| < 2^63 - 1
    index = np.broadcast_to(np.arange(rows.shape[1]), rows.shape)
    return np.lexsort((index, key, group.astype(np.int8)), axis=-1)         # the last key sorts first


def _chunks(x: np.ndarray, chunk: int) -> np.ndarray:
    """x in rows of `chunk` elements, the last row padded with zeros (whose sums are dropped)."""
    return np.concatenate([x, np.zeros(-len(x) % chunk)]).reshape(-1, chunk)


def _running_sums(x: np.ndarray, chunk: int) -> np.ndarray:
    """Left to right within each chunk (the first element as it is, then one IEEE add per
    element), every chunk at once: a column of adds per position -> [chunks, chunk]."""
    cols = _chunks(x, chunk)
    out = np.empty_like(cols)
    out[:, 0] = cols[:, 0]
    for j in range(1, chunk):
        out[:, j] = out[:, j - 1] + cols[:, j]
    return out


def check_reductions(n: int) -> list[Finding]:
    """amax, argmax, the stable sort and the float64 running sum, row by row."""
    out = []
    for dtype in (torch.float32, torch.float64):
        name = "f32" if dtype == torch.float32 else "f64"
        x = inputs(n, dtype, 11)
        width = 37
        rows = x[: (n // width) * width].reshape(-1, width)
        rows[::3] = torch.where(rows[::3].abs() < 1, torch.zeros_like(rows[::3]), rows[::3])   # many ties at 0
        rows[1::5, 3] = -0.0
        r = exact_f64(rows.reshape(-1)).reshape(rows.shape)
        want = _held_to_python("amax", _bulk_amax(r), _py_amax, r)
        out.append(_finding(f"amax {name}", rows.amax(-1), want, (rows[:, 0],)))
        want = _held_to_python("argmax", _bulk_argmax(r), _py_argmax, r)
        out.append(_finding(f"argmax {name}", rows.argmax(-1), want, (rows[:, 0],)))
        for desc in (False, True):
            _, idx = rows.sort(dim=-1, descending=desc, stable=True)
            want = _held_to_python("sort", _bulk_sorted(r, desc), lambda row: _py_sorted(row, desc), r)
            out.append(_finding(f"sort {name} stable{' descending' if desc else ''}", idx, want, (rows[:, 0],)))
    x = inputs(n, torch.float64, 12)
    x = torch.where(torch.isfinite(x) & (x.abs() < 1e300), x, 1.0)
    got = torch.cat([torch.cumsum(c, 0) for c in x.split(1000)])
    sums = _held_to_python("running sums", _running_sums(x.numpy(), 1000), lambda c: list(itertools.accumulate(c)),
                           _chunks(x.numpy(), 1000))
    out.append(_finding("cumsum f64 (running_sum)", got, sums.reshape(-1)[:n], (x,)))
    return out


def check_all(n: int = 1_000_000) -> list[Finding]:
    """Every check, n inputs per op (and dtype)."""
    with np.errstate(all="ignore"):          # inf and NaN are inputs here, not accidents
        return _check_all(n)


def _check_all(n: int) -> list[Finding]:
    out = []
    for dtype in (torch.float32, torch.float64):
        out += check_binary(n, dtype)
        out += check_sqrt(n, dtype)
        out += check_exact(n, dtype)
    out += check_casts(n)
    out += check_reductions(n)
    return out
