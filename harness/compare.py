"""Bitwise comparison of results, and mismatch reports a person can act on.

Tensors are equal only when dtype, shape and every byte agree: -0.0 differs from 0.0, and NaNs
with different payloads differ. Non-tensor data (token lists, counts) is compared with deepdiff after each float and bool is
spelled with its type and bits, so data is bitwise too: -0.0 differs from 0.0, true from 1, 1 from
1.0, and a NaN equals itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import struct

import torch
from deepdiff import DeepDiff

# Same-width integer views of every dtype we store; the view is what "bitwise" compares.
_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
MAX_LISTED_COLUMNS = 10


@dataclass
class TensorDiff:
    name: str
    problem: str  # "missing", "unexpected", "dtype", "shape" or "bits"
    detail: str = ""
    n_diff: int = 0
    numel: int = 0
    first_flat: int = -1
    first_index: tuple = ()
    expected_value: str = ""
    actual_value: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0
    max_ulp: int = 0
    columns: tuple = ()  # differing indices along the last dimension (2-D and up)
    sides: tuple = ("golden", "got")  # what the expected and the actual values are called

    def to_json(self) -> dict:
        return vars(self) | {"first_index": list(self.first_index), "columns": list(self.columns),
                             "sides": list(self.sides)}

    def describe(self) -> str:
        if self.problem != "bits":
            return f"tensor {self.name!r}: {self.detail.replace('golden', self.sides[0])}"
        idx = ", ".join(map(str, self.first_index))
        lines = [
            f"tensor {self.name!r}: {self.n_diff} of {self.numel} elements differ ({self.n_diff / self.numel:.4%})",
            f"  first difference at flat index {self.first_flat} = [{idx}]: "
            f"{self.sides[0]} {self.expected_value}, {self.sides[1]} {self.actual_value}",
            f"  max abs diff {self.max_abs:.6g}, max rel diff {self.max_rel:.6g}, max ULP diff {self.max_ulp}",
        ]
        if self.columns:
            more = "" if len(self.columns) <= MAX_LISTED_COLUMNS else f" … ({len(self.columns)} columns)"
            lines.append(f"  columns (last dim) that differ: {list(self.columns[:MAX_LISTED_COLUMNS])}{more}")
        return "\n".join(lines)


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous().cpu()
    return t.view(_INT_VIEW[t.element_size()]) if t.dtype != torch.bool else t.view(torch.int8)


def _ordered(bits: torch.Tensor) -> torch.Tensor:
    """Map float bit patterns to integers whose difference counts the ULPs between them."""
    b = bits.to(torch.int64)
    if bits.dtype == torch.int64:
        sign_min = torch.iinfo(torch.int64).min
        return torch.where(b < 0, sign_min - b, b)  # exact: sign_min - b lies in [sign_min + 1, 0]
    width = bits.element_size() * 8
    return torch.where(b < 0, -(1 << (width - 1)) - b, b)


def _max_abs_difference(x: torch.Tensor, y: torch.Tensor) -> int:
    """max |x - y| over int64 tensors, exact: x - y can leave int64 (values of opposite sign near the
    extremes), so the differences are ranked in float64 and the few near the top are redone in Python."""
    hi = (x >> 32) - (y >> 32)                              # each part's difference fits in int64
    lo = (x & 0xFFFFFFFF) - (y & 0xFFFFFFFF)
    approx = (hi.to(torch.float64) * 2.0**32 + lo.to(torch.float64)).abs()
    top = approx.max()
    near = (approx >= top * (1 - 1e-9)).nonzero()[:, 0]     # float64 ranks within 2^-52: keep a margin
    return max(abs(int(x[i]) - int(y[i])) for i in near.tolist())


def _value(t: torch.Tensor, flat: int) -> str:
    v = t.reshape(-1)[flat]
    bits = _bits(t.reshape(-1)[flat:flat + 1])[0].item()
    width = t.element_size() * 2
    if t.dtype.is_floating_point:
        return f"{v.item()!r} (0x{bits & ((1 << (width * 4)) - 1):0{width}x})"
    return repr(v.item())


def _unravel(flat: int, shape: tuple) -> tuple:
    """The index of element `flat` of a row-major tensor of `shape` (torch.unravel_index's answer,
    without importing torch.fx's symbolic shapes, ~1 s of every process's first comparison)."""
    index = []
    for size in reversed(shape):
        flat, i = divmod(flat, size)
        index.append(i)
    return tuple(reversed(index))


def diff_tensor(name: str, expected: torch.Tensor, actual: torch.Tensor) -> TensorDiff | None:
    if expected.dtype != actual.dtype:
        return TensorDiff(name, "dtype", f"dtype differs: golden {expected.dtype}, got {actual.dtype}")
    if tuple(expected.shape) != tuple(actual.shape):
        return TensorDiff(name, "shape", f"shape differs: golden {list(expected.shape)}, got {list(actual.shape)}")
    eb, ab = _bits(expected), _bits(actual)
    differ = eb != ab
    n_diff = int(differ.sum())
    if n_diff == 0:
        return None
    where = differ.reshape(-1).nonzero()[:, 0]
    first = int(where[0])
    index = _unravel(first, tuple(expected.shape))
    d = TensorDiff(name, "bits", n_diff=n_diff, numel=expected.numel(), first_flat=first, first_index=index,
                   expected_value=_value(expected, first), actual_value=_value(actual, first))
    e = expected.detach().cpu().reshape(-1)[where]
    a = actual.detach().cpu().reshape(-1)[where]
    if expected.dtype.is_floating_point:
        e64, a64 = e.to(torch.float64), a.to(torch.float64)
        with torch.no_grad():
            abs_diff = (e64 - a64).abs()
            rel = abs_diff / e64.abs()
        finite = abs_diff[~abs_diff.isnan()]
        d.max_abs = float(finite.max()) if finite.numel() else float("nan")
        rel = rel[~rel.isnan()]
        d.max_rel = float(rel.max()) if rel.numel() else float("nan")
        d.max_ulp = _max_abs_difference(_ordered(_bits(e)), _ordered(_bits(a)))
    elif expected.dtype != torch.bool:
        abs_diff = (e.to(torch.float64) - a.to(torch.float64)).abs()
        d.max_abs = float(abs_diff.max())
        d.max_rel = float((abs_diff / e.to(torch.float64).abs()).max())
        d.max_ulp = _max_abs_difference(e.to(torch.int64), a.to(torch.int64))
    if expected.dim() >= 2:
        d.columns = tuple(int(c) for c in differ.reshape(-1, expected.shape[-1]).any(0).nonzero()[:, 0])
    return d


def diff_tensors(expected: dict, actual: dict) -> list[TensorDiff]:
    diffs = []
    for name in sorted(set(expected) | set(actual)):
        if name not in actual:
            diffs.append(TensorDiff(name, "missing", "in the golden but not produced by the run"))
        elif name not in expected:
            diffs.append(TensorDiff(name, "unexpected", "produced by the run but not in the golden"))
        else:
            d = diff_tensor(name, expected[name], actual[name])
            if d:
                diffs.append(d)
    return diffs


def _bitwise(value):
    """JSON-like data with every float and bool replaced by a string naming its type and bits:
    deepdiff compares by ==, which calls -0.0 equal to 0.0, True equal to 1, and NaN unequal to itself."""
    if isinstance(value, bool):
        return f"{value} (bool)"
    if isinstance(value, float):
        return f"{value!r} (float 0x{struct.unpack('<Q', struct.pack('<d', value))[0]:016x})"
    if isinstance(value, dict):
        return {k: _bitwise(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_bitwise(v) for v in value)
    return value


def diff_data(expected, actual) -> str:
    """A readable deepdiff of two JSON-like values; '' when equal (ints, floats and bools bitwise)."""
    dd = DeepDiff(_bitwise(expected), _bitwise(actual), ignore_order=False, verbose_level=2)
    return dd.pretty() if dd else ""
