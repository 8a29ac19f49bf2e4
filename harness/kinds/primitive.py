"""Spec kind `primitive`: one arithmetic primitive on a dense, stratified grid, pinned bit for bit.

    kind: primitive
    description: …
    inputs:
      function: exp            # see FUNCTIONS below (sqrt, sqrt64: kernels.portable's correctly rounded roots)
      implementation: torch    # torch: kernels.portable (on the CPU) | triton: kernels.primitives
    expect:
      oracle: exact            # bits equal an exact rounding written here from first principles
      oracle_ulp: 1            # or: within this many ulps of Python's math (finite results)
      matches_torch: true      # triton: bits equal the torch implementation's on the same grid
      any_nan: true            #   … where both are NaN, any payload matches (different NaN rules)
      except_subnormal: true   #   … inputs that are subnormal are left out (counted in a note)

End-to-end specs rarely see a primitive change: most results round the same way when a polynomial
loses a term or a scan changes its order. So each function runs on every input class that can tell:
the fp32 grid takes every biased exponent (subnormals, ±0, ±inf and NaN payloads included) times
mantissa classes (0, 1, the bf16 halfway patterns 0x7FFF / 0x8000 / 0x8001 with even and odd kept
bits, the top and middle bits, hashed ones) times both signs; each function adds its range-reduction
boundaries with their neighbours (multiples of ln 2 / 2 for exp, sqrt(2)·2^e for log, multiples of
pi/4 for sincos, the overflow and underflow thresholds). The fp64 grid is the same over 2048
exponents with fewer mantissa classes (the fp32 halfway patterns of the low 29 bits among them);
bf16 inputs are all 65536 patterns.
Scans take rows of lengths 1 … 2881 built so the order shows: cancellation, all -0.0, one +0.0 among
-0.0, +inf with -inf, two NaN payloads, mixed magnitudes.

The golden holds the output (`y`, or `y<n>` per scan length; `sin`, `cos` for sincos64) and the
sha256 of each input tensor (so a change of the grid shows in a regen's diff). The torch
implementation is computed on the CPU on every platform and is portable by construction, so its
golden is `shared`; the Triton one is stored per platform as `<device>-fp32-triton` (interpreted on
the CPU, where kernels take kernels.portable_tl's polynomials; compiled on a GPU).
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction

import numpy as np
import torch

from lockstep.harness.digest import tensor_sha256
from lockstep.harness.platform import SHARED
from lockstep.harness.result import SpecResult
from lockstep.harness.schema import Bool, Field, Int, Map, Problem, Str
from lockstep.harness.target import TargetInterface
from lockstep.kernels import _common

NAME = "primitive"
# function -> (input grid, the torch implementation's name in kernels.portable or a lambda key)
ELEMENTWISE = ("exp", "log", "sigmoid", "sqrt", "sqrt64", "to_bf16", "to_fp32", "f64_to_f32", "exp64", "log64",
               "sincos64")
SCANS = ("tree_sum", "prefix_sum", "running_sum", "block_sum", "block_cumsum")
FUNCTIONS = ELEMENTWISE + SCANS
TRITON = ("exp", "log", "sigmoid", "sqrt", "to_bf16", "to_fp32", "f64_to_f32", "exp64", "log64",
          "block_sum", "block_cumsum")
TORCH = tuple(f for f in FUNCTIONS if f not in ("block_sum", "block_cumsum"))
ORACLE_EXACT = ("sqrt", "sqrt64", "to_bf16", "to_fp32", "f64_to_f32", "tree_sum", "prefix_sum", "running_sum")
ORACLE_ULP = ("exp", "log", "sigmoid", "exp64", "log64", "sincos64")

INPUTS = Map({
    "function": Field(Str(choices=FUNCTIONS), required=True),
    "implementation": Field(Str(choices=("torch", "triton")), default="torch"),
})
EXPECT = Map({
    "oracle": Field(Str(choices=("exact",)), doc="bits equal the exact rounding (sqrt, casts, scans)"),
    "oracle_ulp": Field(Int(min=0, max=1 << 20), doc="max ulps from Python's math (exp, log, sigmoid, sincos)"),
    "matches_torch": Field(Bool(), default=False),
    "any_nan": Field(Bool(), default=False),
    "except_subnormal": Field(Bool(), default=False),
})
SCAN_LENGTHS = (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129, 255, 257, 1000, 2880, 2881)


def validate(doc: dict, root=None) -> list[Problem]:
    inp, exp = doc["inputs"], doc["expect"] or {}
    fn, impl = inp["function"], inp["implementation"]
    out = []
    if fn not in (TRITON if impl == "triton" else TORCH):
        out.append(Problem(("inputs", "function"), f"{fn} has no {impl} implementation "
                                                   f"(it has: {', '.join(TRITON if impl == 'triton' else TORCH)})"))
    if exp.get("oracle") and fn not in ORACLE_EXACT:
        out.append(Problem(("expect", "oracle"), f"no exact oracle for {fn} (only {', '.join(ORACLE_EXACT)})", True))
    if exp.get("oracle_ulp") is not None and fn not in ORACLE_ULP:
        out.append(Problem(("expect", "oracle_ulp"), f"no ulp oracle for {fn} (only {', '.join(ORACLE_ULP)})", True))
    if exp.get("matches_torch") and (impl != "triton" or fn not in TORCH):
        out.append(Problem(("expect", "matches_torch"), "only for a triton implementation of a function torch has",
                           True))
    for key in ("any_nan", "except_subnormal"):
        if exp.get(key) and not exp.get("matches_torch"):
            out.append(Problem(("expect", key), "only with matches_torch", True))
    return out


def golden_platform(spec, ctx) -> str:
    return SHARED if spec.inputs["implementation"] == "torch" else ctx.fixed_platform + "-triton"


# --------------------------------------------------------------------------- grids
def _mix(i: int) -> int:
    """splitmix64 of i: fixed pseudo-random integers, the same everywhere."""
    z = (i * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def _from_bits(bits: list[int], dtype: torch.dtype) -> torch.Tensor:
    width = {torch.float32: 32, torch.float64: 64, torch.bfloat16: 16}[dtype]
    signed = [b - (1 << width) if b >= 1 << (width - 1) else b for b in bits]
    view = {32: torch.int32, 64: torch.int64, 16: torch.int16}[width]
    return torch.tensor(signed, dtype=view).view(dtype)


F32_MANTISSAS = (0, 1, 2, 3, 0x7FFF, 0x8000, 0x8001, 0x17FFF, 0x18000, 0x18001, 0x3FFFFF, 0x400000, 0x400001,
                 0x7FFFFE, 0x7FFFFF)
F64_MANTISSAS = (0, 1, 0x10000000, 0x30000000, 0x8000000000000, 0xFFFFFFFFFFFFF)


def f32_grid() -> list[int]:
    """Bits: every biased exponent × the mantissa classes and 4 hashed mantissas × both signs."""
    out = []
    for e in range(256):
        mants = list(F32_MANTISSAS) + [_mix(e * 8 + j) & 0x7FFFFF for j in range(4)]
        for s in (0, 1):
            out += [(s << 31) | (e << 23) | m for m in mants]
    return out


def f64_grid() -> list[int]:
    out = []
    for e in range(2048):
        mants = list(F64_MANTISSAS) + [_mix(1 << 20 | e) & 0xFFFFFFFFFFFFF]
        for s in (0, 1):
            out += [(s << 63) | (e << 52) | m for m in mants]
    return out


def _f32_bits(v: float) -> int:
    """The bits of float32(v), v a finite Python float within the fp32 range (rounded exactly)."""
    return _exact_bits(Fraction(v), 24, -126, 127, 32)


def _neighbours(bits: int, width: int, n: int = 2) -> list[int]:
    """bits and its n neighbours each way in magnitude (same sign)."""
    sign, mag = bits & (1 << (width - 1)), bits & ((1 << (width - 1)) - 1)
    return [sign | (mag + d) for d in range(-n, n + 1) if 0 <= mag + d < (0xFF << 23 if width == 32 else 0x7FF << 52)]


def _f64_bits(v: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", v))[0]


def boundaries(fn: str) -> list[float]:
    """Where fn's range reduction or its special-case tests change branch (Python float arithmetic)."""
    ln2, out = math.log(2.0), []
    if fn in ("exp", "sigmoid", "exp64"):
        ks = range(-1080, 1026) if fn == "exp64" else range(-152, 130)
        out += [k * ln2 for k in ks] + [(k + 0.5) * ln2 for k in ks]
        out += [88.72283905206835, -87.33654475055311, -103.97207708399179, -103.27892990343185]
        if fn == "exp64":
            out += [709.782712893384, 709.7827128933841, -745.2, -745.1332191019411, -746.0, 710.0]
        if fn == "sigmoid":
            out += [-v for v in out] + [16.635532333438686, 36.7368005696771]
    if fn in ("log", "log64"):
        es = range(-1074, 1024) if fn == "log64" else range(-149, 128)
        out += [math.ldexp(math.sqrt(2.0), e) for e in es] + [1.0 + 2.0 ** -k for k in range(1, 53)]
        out += [1.0 - 2.0 ** -k for k in range(1, 53)] + [math.ldexp(1.0, -1022)]
    if fn == "sincos64":
        out += [k * math.pi / 4 for k in range(-64, 65)] + [k * math.pi / 2 for k in range((1 << 20) - 8, (1 << 20) + 8)]
        out += [1.6e6, -1.6e6, 1e-300, 2.0 ** -30]
    if fn == "to_bf16":
        out += [3.3895313892515355e38, 3.3961775292304787e38]   # the largest bf16, and the halfway above it
    if fn == "f64_to_f32":
        out += [3.4028235677973366e38, 3.4028235677973362e38, 1.1754942807573643e-38, 1.401298464324817e-45,
                7.006492321624085e-46]
    return out


def grid(fn: str) -> torch.Tensor:
    """The input tensor of an elementwise function (see the module docstring)."""
    if fn == "to_fp32":
        return _from_bits(list(range(1 << 16)), torch.bfloat16)
    if fn in ("exp64", "log64", "sincos64", "f64_to_f32", "sqrt64"):
        bits = f64_grid()
        for v in boundaries(fn):
            bits += _neighbours(_f64_bits(v), 64, 1)
        if fn == "sqrt64":                                   # perfect squares and their neighbours
            bits += [b for k in range(1, 1 << 26, 65537) for b in _neighbours(_f64_bits(float(k * k)), 64, 1)]
        return _from_bits(bits, torch.float64)
    bits = f32_grid()
    for v in boundaries(fn):
        if abs(v) < 3.4e38:
            bits += _neighbours(_f32_bits(v), 32)
    if fn == "sqrt":                                         # perfect squares and their neighbours
        bits += [b for k in range(1, 4097, 7) for b in _neighbours(_f32_bits(float(k * k)), 32, 1)]
    return _from_bits(bits, torch.float32)


def scan_rows(n: int) -> torch.Tensor:
    """[7, n] fp32 rows where the order of a sum shows (see the module docstring)."""
    rows = []
    g = f32_grid()
    finite = [b for b in g if 100 << 23 <= b & 0x7FFFFFFF < 154 << 23]
    rows.append([finite[_mix(n << 16 | i) % len(finite)] for i in range(n)])           # mixed magnitudes
    rows.append([0x4B800000] + [0x3F800000] * max(n - 2, 0) + ([0xCB800000] if n > 1 else []))   # 2^24, 1…, -2^24
    rows.append([0x80000000] * n)                                                        # all -0.0
    rows.append([0x80000000 if i != _mix(n) % n else 0 for i in range(n)])               # one +0.0
    inf = [0x3F800000] * n
    inf[_mix(n + 1) % n], inf[-1] = 0x7F800000, 0xFF800000 if n > 1 else 0x7F800000
    rows.append(inf)                                                                     # +inf, -inf
    nan = [0x3F800000] * n
    nan[0], nan[-1] = 0x7FC00001, 0xFFC00002 if n > 1 else 0x7FC00001
    rows.append(nan)                                                                     # two payloads
    rows.append([(_mix(3 << 40 | n << 16 | i) & 0x807FFFFF) | ((1 + _mix(i) % 40) << 23) for i in range(n)])
    return _from_bits([b for r in rows for b in r], torch.float32).view(len(rows), n)


# --------------------------------------------------------------------------- implementations
# --------------------------------------------------------------------------- oracles
FORMATS = {torch.float32: (24, -126, 127, 32), torch.float64: (53, -1022, 1023, 64), torch.bfloat16: (8, -126, 127, 16)}


def _exact_bits(v: Fraction, p: int, emin: int, emax: int, width: int, negative: bool = False) -> int:
    """The bits of v rounded to nearest, ties to even, in the binary format (p, emin, emax): exact
    integer arithmetic, no float rounding anywhere."""
    sign = 1 << (width - 1) if (v < 0 or (v == 0 and negative)) else 0
    a = abs(v)
    if a == 0:
        return sign
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    e = max(e, emin)                                          # below: subnormal spacing
    q = a / Fraction(2) ** (e - p + 1)
    n, rem = divmod(q.numerator, q.denominator)
    if 2 * rem > q.denominator or (2 * rem == q.denominator and n & 1):
        n += 1
    if n == 1 << p:                                            # rounded up into the next binade
        n, e = n >> 1, e + 1
    mbits = p - 1
    if e > emax:
        return sign | (((1 << (width - 1 - mbits)) - 1) << mbits)   # inf
    if n < 1 << mbits:                                         # subnormal
        return sign | n
    return sign | ((e + (1 << (width - 2 - mbits)) - 1) << mbits) | (n - (1 << mbits))


def _bits_of(t: torch.Tensor) -> list[int]:
    width = t.element_size() * 8
    view = {16: torch.int16, 32: torch.int32, 64: torch.int64}[width]
    return [b & ((1 << width) - 1) for b in t.contiguous().view(view).tolist()]


def _is_nan_bits(b: int, dtype: torch.dtype) -> bool:
    p, _, _, width = FORMATS[dtype]
    mag = b & ((1 << (width - 1)) - 1)
    return mag > (((1 << (width - p)) - 1) << (p - 1))


def round_to(values: list, dtype: torch.dtype) -> list[int]:
    """Exactly rounded bits of each value (a Fraction, or a float: inf, nan and -0.0 kept)."""
    p, emin, emax, width = FORMATS[dtype]
    out = []
    for v in values:
        if isinstance(v, float) and math.isnan(v):
            out.append(None)                                    # any NaN
        elif isinstance(v, float) and math.isinf(v):
            out.append((1 << (width - 1) if v < 0 else 0) | (((1 << (width - p)) - 1) << (p - 1)))
        else:
            neg = isinstance(v, float) and math.copysign(1.0, v) < 0
            out.append(_exact_bits(Fraction(v), p, emin, emax, width, neg))
    return out


def exact_oracle(fn: str, x: torch.Tensor) -> list:
    """The correctly rounded result of fn on each input, as bits (None: any NaN)."""
    vals = x.to(torch.float64).tolist() if fn != "f64_to_f32" else x.tolist()
    if fn in ("sqrt", "sqrt64"):
        res = []
        for v in vals:
            if math.isnan(v) or v < 0:
                res.append(math.nan)
            elif math.isinf(v) or v == 0:
                res.append(v)
            else:
                res.append(math.sqrt(v))   # correctly rounded in float64: rounding again to fp32 is exact (53 >= 2*24+2)
        return round_to(res, torch.float32 if fn == "sqrt" else torch.float64)
    if fn == "to_bf16":
        return round_to(vals, torch.bfloat16)
    if fn in ("to_fp32", "f64_to_f32"):
        return round_to(vals, torch.float32)
    raise ValueError(fn)


def _as_float(bits: int, width: int) -> float:
    if width == 32:
        return struct.unpack("<f", struct.pack("<I", bits))[0]
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def scan_oracle(fn: str, x: torch.Tensor) -> list:
    """The documented order (kernels/portable.py), rewritten in numpy: each step one IEEE addition per
    element (correctly rounded, so any machine's numpy gives these bits); bits per output, None for NaN."""

    out = []
    for row in x:
        s = np.frombuffer(struct.pack(f"<{row.numel()}I", *_bits_of(row)), dtype=np.float32).copy()
        with np.errstate(invalid="ignore", over="ignore"):
            if fn == "tree_sum":
                n = len(s)
                p = 1 << (n.bit_length() - 1)
                head = s[:p].copy()
                head[:n - p] = head[:n - p] + s[p:]
                s = head
                while p > 1:
                    p //= 2
                    s = s[:p] + s[p:2 * p]
            elif fn == "prefix_sum":
                step = 1
                while step < len(s):
                    s = np.concatenate([s[:step], s[:-step] + s[step:]])
                    step *= 2
            else:   # running_sum: float64, left to right from +0.0 (so a leading -0.0 becomes +0.0)
                acc, res = 0.0, []
                for v in s.astype(np.float64).tolist():
                    acc = acc + v
                    res.append(acc)
                s = np.array(res, dtype=np.float64)
        width = s.dtype.itemsize * 8
        bits = s.view(np.uint32 if width == 32 else np.uint64).tolist()
        out += [None if math.isnan(v) else b for v, b in zip(s.tolist(), bits)]
    return out


def _ulps(a: int, b: int, width: int) -> int:
    def ordered(x):
        return -(x & ((1 << (width - 1)) - 1)) if x >> (width - 1) else x
    return abs(ordered(a) - ordered(b))


def _math(fn: str, v: float) -> float:
    try:
        if fn in ("exp", "exp64"):
            return math.exp(v)
        if fn in ("log", "log64"):
            return math.nan if v < 0 or math.isnan(v) else (-math.inf if v == 0 else math.log(v))
        if fn == "sigmoid":
            return 1.0 / (1.0 + math.exp(-v))
    except OverflowError:
        return math.inf if fn != "sigmoid" else 0.0
    raise ValueError(fn)


def ulp_failures(fn: str, x: torch.Tensor, y, bound: int) -> list[str]:
    """Inputs whose result is further than `bound` ulps from Python's math (or NaN-ness differs)."""
    bad, worst = 0, (0, None)
    xs = x.to(torch.float64).tolist()
    outs = [("sin", y[0], math.sin), ("cos", y[1], math.cos)] if fn == "sincos64" else [(fn, y, None)]
    for name, t, f in outs:
        width = t.element_size() * 8
        got = _bits_of(t)
        for v, g in zip(xs, got):
            if fn == "sincos64":
                if not math.isfinite(v) or abs(v) > 1.6e6:
                    continue                     # outside the domain: NaN by definition, pinned by the golden
                want = f(v)
            else:
                want = _math(fn, v)
            w = round_to([want], t.dtype)[0]
            if w is None or _is_nan_bits(g, t.dtype):
                if (w is None) != _is_nan_bits(g, t.dtype):
                    bad += 1
                    worst = max(worst, (1 << 62, (name, v, g)))
                continue
            d = _ulps(g, w, width)
            if d > bound:
                bad += 1
                worst = max(worst, (d, (name, v, g)))
    if not bad:
        return []
    d, (name, v, g) = worst
    return [f"{name}: {bad} results are more than {bound} ulps from Python's math; worst at input {v!r}: "
            f"{'NaN-ness differs' if d == 1 << 62 else f'{d} ulps'} (got 0x{g:x})"]


# --------------------------------------------------------------------------- the run
def inputs(fn: str) -> dict[str, torch.Tensor]:
    if fn in SCANS:
        return {f"x{n}": scan_rows(n) for n in SCAN_LENGTHS}
    return {"x": grid(fn)}


def run(spec, ctx, target: TargetInterface) -> SpecResult:
    """Lockstep's own primitives against their oracles, through its target's `primitive` operation
    (no other target computes them: n/a there)."""
    prim = target.op("primitive", str(ctx.device), why=f"kind {NAME!r} has no target runner")
    fn, impl, exp = spec.inputs["function"], spec.inputs["implementation"], spec.expect
    xs = inputs(fn)
    outs = {}
    for key, x in xs.items():
        y = prim(fn, impl, x)
        suffix = key[1:]
        if fn == "sincos64":
            outs["sin" + suffix], outs["cos" + suffix] = y
        else:
            outs["y" + suffix] = y
    failures, notes = [], []
    oracles = impl == "torch" or _common.PORTABLE_MATH       # compiled Triton: the GPU's own functions
    if not oracles:
        notes.append(f"{fn}: compiled Triton uses the GPU's own functions (FMA, approximate sqrt): pinned by "
                     f"this platform's golden, not held to the oracle")
    for key, x in xs.items():
        suffix = key[1:]
        y = outs.get("y" + suffix)
        if not oracles:
            continue
        if exp.get("oracle") == "exact":
            want = scan_oracle(fn, x) if fn in SCANS else exact_oracle(fn, x)
            got = _bits_of(y.reshape(-1))
            wrong = [i for i, (g, w) in enumerate(zip(got, want))
                     if (w is None and not _is_nan_bits(g, y.dtype)) or (w is not None and g != w)]
            if wrong:
                i = wrong[0]
                failures.append(f"{fn} ({impl}{', length ' + suffix if suffix else ''}): {len(wrong)} of {len(got)} "
                                f"results are not the exact rounding; first at flat index {i}: got 0x{got[i]:x}, "
                                f"exact {'a NaN' if want[i] is None else hex(want[i])}")
        if exp.get("oracle_ulp") is not None:
            y_all = (outs["sin" + suffix], outs["cos" + suffix]) if fn == "sincos64" else y
            failures += [f"{fn} ({impl}): {m}" for m in ulp_failures(fn, x, y_all, exp["oracle_ulp"])]
        if exp.get("matches_torch"):
            failures += _match_torch(fn, x, y, prim(fn, "torch", x), exp, notes, suffix)
    grids = {key: tensor_sha256(x) for key, x in xs.items()}    # the inputs, by digest: code, not data
    return SpecResult(tensors=outs, data={"failures": failures, "inputs_sha256": grids}, notes=notes)


def _match_torch(fn, x, y, ref, exp, notes, suffix) -> list[str]:
    """The Triton output `y` against `ref`, the torch implementation's on the same inputs."""

    if not _common.PORTABLE_MATH:
        notes.append(f"{fn}: compiled Triton uses the GPU's own functions, not compared with the torch implementation")
        return []
    got, want = _bits_of(y.reshape(-1)), _bits_of(ref.reshape(-1))
    keep = [True] * len(got)
    if exp.get("except_subnormal"):
        xb = _bits_of(x.reshape(-1))
        p, _, _, width = FORMATS[x.dtype]
        keep = [not (0 < b & ((1 << (width - 1)) - 1) < 1 << (p - 1)) for b in xb]
        notes.append(f"{fn}: {keep.count(False)} subnormal inputs left out of the comparison with torch")
    wrong = [i for i, (g, w, k) in enumerate(zip(got, want, keep)) if k and g != w and not (
        exp.get("any_nan") and _is_nan_bits(g, y.dtype) and _is_nan_bits(w, y.dtype))]
    if not wrong:
        return []
    i = wrong[0]
    xv = x.reshape(-1)[i].item() if fn not in SCANS else f"row {i // y.shape[-1] if y.dim() > 1 else i}"
    return [f"{fn} (triton{', length ' + suffix if suffix else ''}): {len(wrong)} of {len(got)} results differ "
            f"from the torch implementation; first at flat index {i} (input {xv}): triton 0x{got[i]:x}, "
            f"torch 0x{want[i]:x}"]


def check(spec, result: SpecResult) -> list[str]:
    return list(result.data.get("failures", []))
