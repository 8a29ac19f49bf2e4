"""Integer sequences in specs: written out, a range, or pseudo-random from the hash itself.

    seeds: [0, 1, -1]                          a literal list
    seeds: {arange: [0, 1024]}                 start, stop[, step], as Python's range (step != 0)
    seeds: {hashed: {count: 1024, seed: 7}}    count pseudo-random int64 values
    pos:   {hashed: {count: 1024, seed: 8, below: 100000}}   … reduced mod `below`

`hashed` values come from MurmurHash3 (kernels.coins, torch reference) of (seed, i, 0) and
(seed, i, 1) as the high and low halves of a uint64, so they are the same on every platform
and every torch version, unlike torch.randint.

The schema checks the length and the range of the values of every form without materializing
it (an `arange` of 10^12 values is an error at validation, not an allocation at run time).
"""

from __future__ import annotations

import torch

from lockstep.harness.limits import MAX_GENERATED
from lockstep.harness.schema import Field, Int, List, Map, OneOf, Problem, Schema
from lockstep.kernels.coins import murmur_hash32_torch

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class IntSeq(Schema):
    """A list, `arange` or `hashed` sequence of int64 values with at least `min_len` and at most
    `max_len` values, each in [min_value, max_value]."""

    def __init__(self, min_len: int = 1, min_value: int = INT64_MIN, max_value: int = INT64_MAX,
                 max_len: int = MAX_GENERATED):
        self.min_len, self.max_len, self.min_value, self.max_value = min_len, max_len, min_value, max_value
        self.forms = OneOf(
            List(Int(min=min_value, max=max_value), min_len=min_len, max_len=max_len),
            Map({"arange": Field(List(Int(min=INT64_MIN, max=INT64_MAX), min_len=2, max_len=3), required=True,
                                 doc="[start, stop] or [start, stop, step]")}),
            Map({"hashed": Field(Map({
                "count": Field(Int(min=max(1, min_len), max=max_len), required=True),
                "seed": Field(Int(min=INT64_MIN, max=INT64_MAX), required=True),
                "below": Field(Int(min=1, max=INT64_MAX), doc="reduce the values mod this bound (non-negative)"),
            }), required=True)}),
        )
        self.expected = self.forms.expected

    def check(self, value, path, problems):
        before = len(problems)
        desc = self.forms.check(value, path, problems)
        if len(problems) == before and isinstance(desc, dict):
            problems.extend(self._generated_problems(desc, path))
        return desc

    def _generated_problems(self, desc: dict, path) -> list[Problem]:
        if "arange" in desc:
            return self._arange_problems(desc["arange"], path + ("arange",))
        h, where = desc["hashed"], path + ("hashed",)
        if h.get("below") is None and (self.min_value > INT64_MIN or self.max_value < INT64_MAX):
            return [Problem(where, f"hashed values are any int64 (negative ones too); give 'below' to keep them "
                                   f"in [0, below), within [{self.min_value}, {self.max_value}]")]
        if h.get("below") is not None and (self.min_value > 0 or h["below"] - 1 > self.max_value):
            return [Problem(where + ("below",), f"values in [0, {h['below']}) are not all within "
                                                f"[{self.min_value}, {self.max_value}]")]
        return []

    def _arange_problems(self, bounds: list[int], where) -> list[Problem]:
        start, stop, *step = bounds
        step = step[0] if step else 1
        if step == 0:
            return [Problem(where + (2,), "the step of an arange must not be 0")]
        values = range(start, stop, step)
        if not self.min_len <= len(values) <= self.max_len:
            return [Problem(where, f"expected {self.min_len}..{self.max_len} values, the range {bounds} has "
                                   f"{len(values)}")]
        if values and (min(values[0], values[-1]) < self.min_value or max(values[0], values[-1]) > self.max_value):
            return [Problem(where, f"values from {values[0]} to {values[-1]} are not all within "
                                   f"[{self.min_value}, {self.max_value}]")]
        return []


def materialize(desc):
    """The int64 tensor a validated IntSeq description stands for."""

    if isinstance(desc, list):
        return torch.tensor(desc, dtype=torch.int64).reshape(-1)
    if "arange" in desc:
        start, stop, *step = desc["arange"]
        return torch.arange(start, stop, step[0] if step else 1, dtype=torch.int64)

    h = desc["hashed"]
    idx = torch.arange(h["count"], dtype=torch.int64)
    halves = murmur_hash32_torch(torch.full_like(idx, h["seed"]), idx, torch.tensor([0, 1]))
    values = (halves[:, 0] << 32) | halves[:, 1]  # wraps into int64 like the uint64 bit pattern
    if h.get("below"):
        values = torch.remainder(values, h["below"])
    return values


def length(desc) -> int:
    if isinstance(desc, list):
        return len(desc)
    if "arange" in desc:
        start, stop, *step = desc["arange"]
        return len(range(start, stop, step[0] if step else 1))
    return desc["hashed"]["count"]


def max_value(desc) -> int | None:
    """The largest value of a validated sequence (an upper bound for `hashed`), without materializing
    it; None when the sequence is empty."""
    if isinstance(desc, list):
        return max(desc, default=None)
    if "arange" in desc:
        values = range(*desc["arange"])
        return max(values[0], values[-1]) if values else None
    below = desc["hashed"].get("below")
    return below - 1 if below else INT64_MAX
