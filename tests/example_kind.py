"""A whole spec kind in one module: the documented example (tests/test_kind_registry.py registers it).

    kind: one-hash
    description: the seeded hash of one key
    inputs:
      key: [42, 7, 3]          # [seed, position, column]
    expect:
      hash: 1234567890         # optional: the known answer

It runs against the target interface only (the `hash` operation), so the one `run` below serves
Lockstep's engine (plain `check`, its golden compared bit for bit) and any other target
(`check --target NAME`: n/a without a `hash`, bitwise against the same golden otherwise).
"""

from __future__ import annotations

import torch

from lockstep.harness.platform import SHARED
from lockstep.harness.result import SpecResult
from lockstep.harness.schema import Field, Int, List, Map
from lockstep.harness.target import BITWISE, TargetInterface

NAME = "one-hash"
INPUTS = Map({"key": Field(List(Int(min=0), min_len=3, max_len=3), required=True, doc="[seed, position, column]")})
EXPECT = Map({"hash": Field(Int(min=0), doc="the known answer")})


def golden_platform(spec, ctx) -> str:
    return SHARED                     # an integer hash: the same bits on every platform


def run(spec, ctx, target: TargetInterface) -> SpecResult:
    seed, pos, col = (torch.tensor([v], dtype=torch.int64) for v in spec.inputs["key"])
    h = target.op("hash", str(ctx.device))(seed, pos, col)
    return SpecResult(tensors={"hash": torch.as_tensor(h).reshape(1).to(torch.int64).cpu()})


def check(spec, result: SpecResult) -> list[str]:
    want, got = spec.expect.get("hash"), int(result.tensors["hash"][0])
    return [] if want is None or want == got else [f"hash {got}, the spec expects {want}"]


def applicability(spec, target: TargetInterface, device: str) -> str:
    target.op("hash", device)
    return BITWISE
