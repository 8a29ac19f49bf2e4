"""Integer sequences in specs: written out, a range, or pseudo-random from the hash itself.

    seeds: [0, 1, -1]                          a literal list
    seeds: {arange: [0, 1024]}                 start, stop[, step], as Python's range
    seeds: {hashed: {count: 1024, seed: 7}}    count pseudo-random int64 values
    pos:   {hashed: {count: 1024, seed: 8, below: 100000}}   … reduced mod `below`

`hashed` values come from MurmurHash3 (kernels.coins, torch reference) of (seed, i, 0) and
(seed, i, 1) as the high and low halves of a uint64, so they are the same on every platform
and every torch version, unlike torch.randint.
"""

from __future__ import annotations

import torch

from harness.schema import Field, Int, List, Map, OneOf, Schema

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_GENERATED = 1 << 22  # keeps a typo from allocating gigabytes


def IntSeq(min_len: int = 1, min_value: int = INT64_MIN) -> Schema:
    value = Int(min=min_value, max=INT64_MAX)
    return OneOf(
        List(value, min_len=min_len),
        Map({"arange": Field(List(Int(min=INT64_MIN, max=INT64_MAX), min_len=2, max_len=3), required=True,
                             doc="[start, stop] or [start, stop, step]")}),
        Map({"hashed": Field(Map({
            "count": Field(Int(min=1, max=MAX_GENERATED), required=True),
            "seed": Field(Int(min=INT64_MIN, max=INT64_MAX), required=True),
            "below": Field(Int(min=1, max=INT64_MAX), doc="reduce the values mod this bound (non-negative)"),
        }), required=True)}),
    )


def materialize(desc) -> torch.Tensor:
    """The int64 tensor a validated IntSeq description stands for."""
    if isinstance(desc, list):
        return torch.tensor(desc, dtype=torch.int64).reshape(-1)
    if "arange" in desc:
        start, stop, *step = desc["arange"]
        values = torch.arange(start, stop, step[0] if step else 1, dtype=torch.int64)
        if values.numel() > MAX_GENERATED:
            raise ValueError(f"arange {desc['arange']} has {values.numel()} values, more than {MAX_GENERATED}")
        return values
    from kernels.coins import murmur_hash32_torch

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
