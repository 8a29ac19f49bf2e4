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

Inputs mix special values (+-0, +-inf, NaNs with payloads, subnormals, the extremes, halfway
cases) with random bit patterns over every exponent and ordinary values; each op also runs on
slices of 1..67 elements so the scalar tails of the vector loops are checked as well.

`lockstep doctor` runs `check_all(n)` and prints the ops that are not IEEE here;
tests/test_primitive_oracle.py runs it with 10^6 inputs per op. `REFERENCE_OPS` is the closed
list of aten ops the reference may call (tests/test_primitive_oracle.py holds the engine to it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from kernels import portable

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
    top = np.zeros_like(m)
    for s in (32, 16, 8, 4, 2, 1):                                  # bit length of m, minus one
        big = (m >> (top + s)) > 0
        top = np.where(big, top + s, top)
    lsb = np.maximum(e2 + top - 23, -149)                           # float32's ulp at this value
    d = lsb - e2                                                    # bits to drop (>= 29 here)
    safe_d = np.clip(d, 1, 62)
    q = m >> safe_d
    r = m - (q << safe_d)
    half = np.int64(1) << (safe_d - 1)
    q = q + ((r > half) | ((r == half) & ((q & 1) == 1)))
    q = np.where(d > 62, 0, q)
    v = np.ldexp(q.astype(np.float64), lsb)                         # exact: q < 2^25
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


def tails(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> torch.Tensor:
    """fn applied to slices of 1, 2, ..., 67, 1, 2, ... elements, concatenated: every length of
    scalar tail a vector loop can leave (AVX-512 holds 16 floats or 8 doubles)."""
    n, out, start, length = args[0].numel(), [], 0, 1
    while start < n:
        stop = min(n, start + length)
        out.append(fn(*(a[start:stop] for a in args)))
        start, length = stop, length % 67 + 1
    return torch.cat(out)


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


def _py_div(a: float, b: float) -> float:
    if b == 0.0:
        if a == 0.0 or a != a:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


_BINARY = {"add": (torch.add, lambda a, b: a + b), "sub": (torch.sub, lambda a, b: a - b),
           "mul": (torch.mul, lambda a, b: a * b), "div": (torch.div, _py_div)}


def _ieee(values: list[float], dtype: torch.dtype) -> np.ndarray:
    v = np.array(values, dtype=np.float64)
    return round_to_f32(v) if dtype == torch.float32 else v


def check_binary(n: int, dtype: torch.dtype) -> list[Finding]:
    out = []
    a, b = inputs(n, dtype, 1), inputs(n, dtype, 2)[torch.randperm(n, generator=torch.Generator().manual_seed(3))]
    al, bl = a.tolist(), b.tolist()
    name = "f32" if dtype == torch.float32 else "f64"
    for op, (t_fn, py) in _BINARY.items():
        want = _ieee([py(x, y) for x, y in zip(al, bl)], dtype)
        out.append(_finding(f"{op} {name}", t_fn(a, b), want, (a, b)))
        out.append(_finding(f"{op} {name} (tails)", tails(t_fn, a, b), want, (a, b)))
        for s in (0.5, 3.0, 1e-5, -7.0, 2880):                     # tensor op Python scalar
            sv = float(torch.tensor(s, dtype=dtype))                # the scalar as the dtype holds it
            want_s = _ieee([py(x, sv) for x in al], dtype)
            out.append(_finding(f"{op} {name} scalar {s}", t_fn(a, s), want_s, (a,)))
    want = _ieee([_py_div(1.0, x) for x in al], dtype)
    out.append(_finding(f"reciprocal {name}", tails(torch.reciprocal, a), want, (a,)))
    want = _ieee([1.0 - x for x in al], dtype)
    out.append(_finding(f"rsub {name} 1", tails(lambda t: torch.rsub(t, 1), a), want, (a,)))
    out.append(_finding(f"neg {name}", tails(torch.neg, a), np.array([-x for x in al]), (a,)))
    out.append(_finding(f"abs {name}", tails(torch.abs, a), np.array([abs(x) for x in al]), (a,)))
    return out


def check_sqrt(n: int, dtype: torch.dtype) -> list[Finding]:
    a = inputs(n, dtype, 4)
    want = _ieee([math.sqrt(x) if x >= 0 else math.nan for x in a.tolist()], dtype)
    name = "f32" if dtype == torch.float32 else "f64"
    return [_finding(f"portable.sqrt {name}", tails(portable.sqrt, a), want, (a,))]


def check_torch_sqrt(n: int, dtype: torch.dtype) -> Finding:
    """torch's own sqrt, for `doctor` to show (the reference does not call it)."""
    a = inputs(n, dtype, 4).abs()
    want = _ieee([math.sqrt(x) for x in a.tolist()], dtype)
    return _finding(f"torch.sqrt {'f32' if dtype == torch.float32 else 'f64'} (not used)", torch.sqrt(a), want, (a,))


def check_casts(n: int) -> list[Finding]:
    out = []
    a64 = inputs(n, torch.float64, 5)
    out.append(_finding("cast f64->f32", tails(lambda t: t.to(torch.float32), a64), round_to_f32(a64.numpy()), (a64,)))
    a32 = inputs(n, torch.float32, 6)
    out.append(_finding("cast f32->f64", tails(lambda t: t.to(torch.float64), a32),
                        np.array(a32.tolist(), dtype=np.float64), (a32,)))
    bits = a32.view(torch.int32).numpy().view(np.uint32)
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
    il = ints.tolist()
    out.append(_finding("cast i64->f64", tails(lambda t: t.to(torch.float64), ints), np.array([float(v) for v in il]), (ints,)))
    out.append(_finding("cast i64->f32", tails(lambda t: t.to(torch.float32), ints),
                        round_to_f32(np.array([float(v) for v in il])), (ints,)))
    whole = torch.floor(a64.clamp(-2.0 ** 62, 2.0 ** 62))
    whole = torch.where(torch.isnan(whole), 0.0, whole)
    out.append(_finding("cast f64->i64 (integral values)", tails(lambda t: t.to(torch.int64), whole),
                        np.array([int(v) for v in whole.tolist()], dtype=np.int64), (whole,)))
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


def _py_max(a: float, b: float) -> float:
    if a != a or b != b:
        return math.nan
    return a if a > b else b if b > a else a        # equal values (+0 and -0 included): the first


def check_exact(n: int, dtype: torch.dtype) -> list[Finding]:
    out = []
    name = "f32" if dtype == torch.float32 else "f64"
    a, b = inputs(n, dtype, 8), inputs(n, dtype, 9)
    al, bl = a.tolist(), b.tolist()
    f = np.array
    out.append(_finding(f"floor {name}", tails(torch.floor, a), f([_py_floor(x) for x in al]), (a,)))
    out.append(_finding(f"round {name}", tails(torch.round, a), f([_py_round(x) for x in al]), (a,)))
    for lo, hi in ((-7.0, 7.0), (None, 7.0), (-745.0, 709.0), (0, 1)):
        got = tails(lambda t: torch.clamp(t, lo, hi), a)
        out.append(_finding(f"clamp {name} [{lo}, {hi}]", got, f([_py_clamp(x, lo, hi) for x in al]), (a,)))
    out.append(_finding(f"maximum {name}", tails(torch.maximum, a, b), f([_py_max(x, y) for x, y in zip(al, bl)]), (a, b)))
    pairs = [(x, y) for x, y in zip(al, bl)]
    for op, py in (("eq", lambda x, y: x == y), ("ne", lambda x, y: x != y), ("lt", lambda x, y: x < y),
                   ("le", lambda x, y: x <= y), ("gt", lambda x, y: x > y), ("ge", lambda x, y: x >= y)):
        got = tails(getattr(torch, op), a, b)
        out.append(_finding(f"{op} {name}", got, f([py(x, y) for x, y in pairs]), (a, b)))
    out.append(_finding(f"isnan {name}", tails(torch.isnan, a), f([x != x for x in al]), (a,)))
    out.append(_finding(f"isfinite {name}", tails(torch.isfinite, a), f([math.isfinite(x) for x in al]), (a,)))
    cond = a > b
    out.append(_finding(f"where {name}", tails(torch.where, cond, a, b), f([x if c else y for c, x, y in zip(cond.tolist(), al, bl)]), (a, b)))
    toward = torch.where(torch.rand(n, generator=torch.Generator().manual_seed(10)) < 0.5, math.inf, -math.inf).to(dtype)
    want = f([math.nextafter(x, t) if dtype == torch.float64 else np.nextafter(np.float32(x), np.float32(t))
              for x, t in zip(al, toward.tolist())]) if dtype == torch.float64 else \
        np.nextafter(a.numpy(), toward.numpy())
    out.append(_finding(f"nextafter {name}", tails(torch.nextafter, a, toward), want, (a, toward)))
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
        rl = rows.tolist()

        def amax_py(r):
            if any(v != v for v in r):
                return math.nan
            m = max(r)
            return m if m != 0 else (0.0 if any(v == 0 and math.copysign(1, v) > 0 for v in r) else -0.0)

        out.append(_finding(f"amax {name}", rows.amax(-1), np.array([amax_py(r) for r in rl]), (rows[:, 0],)))

        def argmax_py(r):
            nan = [i for i, v in enumerate(r) if v != v]
            return nan[0] if nan else max(range(len(r)), key=lambda i: (r[i], -i))

        out.append(_finding(f"argmax {name}", rows.argmax(-1), np.array([argmax_py(r) for r in rl]), (rows[:, 0],)))
        for desc in (False, True):
            _, idx = rows.sort(dim=-1, descending=desc, stable=True)

            def key(r, i):
                v = r[i]
                if v != v:                       # NaN sorts above every value
                    return (1, 0.0, i) if not desc else (0, 0.0, i)
                return (0, v, i) if not desc else (1, -v, i)

            want = np.array([sorted(range(width), key=lambda i, r=r: key(r, i)) for r in rl])
            out.append(_finding(f"sort {name} stable{' descending' if desc else ''}", idx, want, (rows[:, 0],)))
    x = inputs(n, torch.float64, 12)
    x = torch.where(torch.isfinite(x) & (x.abs() < 1e300), x, 1.0)
    got = torch.cat([torch.cumsum(c, 0) for c in x.split(1000)])
    cum = []
    for c in x.split(1000):                                 # left to right, one add per element
        s = None
        for v in c.tolist():
            s = v if s is None else s + v
            cum.append(s)
    out.append(_finding("cumsum f64 (running_sum)", got, np.array(cum), (x,)))
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
