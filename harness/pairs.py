"""Which (dtype policy, backend) pairs a spec runs under when `check`, `diff`, `regen` or the pytest
plugin are given no `--dtype` / `--backend`.

A pair is a dtype policy (fp32, bf16) and an engine backend (torch, triton). On a device:
  - `check` and `diff` run fp32 on the torch backend (the reference: `shared` goldens are read
    under it) and every other pair that has goldens here: whose engine golden folder
    (`golden/<device>-<dtype>[-triton]`, e.g. `cpu-bf16`, `cpu-fp32-triton`, `cuda-sm90-bf16-triton`)
    holds a golden.
  - `regen` records every pair the spec supports (below), so a new pair or a new spec cannot be
    left half-recorded: the next `check` reports the pairs it lacks as MISSING.
  - `--dtype` and `--backend` narrow the pairs to those with that policy / backend. Both given
    name exactly one pair, which runs on every selected spec whether or not it has goldens here
    or the spec supports it (the way to try a spec in the interpreter, or record one there).

A spec **supports** a pair on a device unless the pair's backend is `triton`, the device is the
CPU (where Triton runs in its interpreter, seconds per forward of the `tiny` preset) and the spec
runs the engine: then only a spec with the tag `interpreter` supports it, and only under the
policies in INTERPRETER_DTYPES (fp32). The interpreted engine is checked on the specs written for
it (small, and reaching the kernel branches the GPU engine takes), not on all of them.

One row per golden folder: a spec whose golden folder is the same under several pairs (coins,
verify and kernel specs, layer-ID resolution: their results do not depend on the pair; mxfp4
specs depend on the backend only) runs once per folder, under the first of its pairs in
`ALL_PAIRS` order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lockstep.harness import kinds
from lockstep.harness.platform import DTYPE_POLICIES, Platform
from lockstep.harness.result import RunContext

BACKENDS = ("torch", "triton")
INTERPRETER_TAG = "interpreter"   # an engine spec meant for the Triton interpreter on the CPU
# The dtype policies the interpreter runs those specs under. bf16 would add about as much again
# (~40 s on the 2-core CI machine) to a default run already near its 6 minutes: add it here, and
# record golden/cpu-bf16-triton, when there is room.
INTERPRETER_DTYPES = ("fp32",)


@dataclass(frozen=True)
class Pair:
    dtype: str
    backend: str

    @property
    def label(self) -> str:
        return f"{self.dtype}/{self.backend}"

    def context(self, device: str, world_sizes: tuple[int, ...] = ()) -> RunContext:
        return RunContext(platform=Platform(device, self.dtype), backend=self.backend, world_sizes=world_sizes)


DEFAULT = Pair("fp32", "torch")
ALL_PAIRS = tuple(Pair(d, b) for b in BACKENDS for d in DTYPE_POLICIES)   # fp32/torch, bf16/torch, fp32/triton, …


def recorded(golden: Path, device: str) -> list[Pair]:
    """The pairs whose engine golden folder on `device` holds at least one golden manifest."""
    def has_goldens(folder: Path) -> bool:
        return folder.is_dir() and any(f.is_file() for f in folder.rglob("*.json"))

    return [p for p in ALL_PAIRS if has_goldens(Path(golden) / p.context(device).engine_platform)]


def chosen(device: str, golden: Path, dtype: str | None = None, backend: str | None = None,
           regen: bool = False) -> list[Pair]:
    """The pairs a command runs: see the module docstring."""
    if dtype is not None and backend is not None:
        return [Pair(dtype, backend)]
    found = list(ALL_PAIRS) if regen else [p for p in ALL_PAIRS if p == DEFAULT or p in recorded(golden, device)]
    narrowed = [p for p in found if dtype in (None, p.dtype) and backend in (None, p.backend)]
    return narrowed or [Pair(dtype or DEFAULT.dtype, backend or DEFAULT.backend)]


def _golden_platform(spec, ctx: RunContext) -> str:
    return kinds.KINDS[spec.kind].golden_platform(spec, ctx)


def folders(spec, device: str) -> set[str]:
    """The golden folders the spec reads on `device`, over every pair."""
    return {_golden_platform(spec, p.context(device)) for p in ALL_PAIRS}


def runs_the_engine(spec, device: str) -> bool:
    """Whether the spec runs the engine: its golden folder depends on the dtype policy (the kernel,
    coins and mxfp4 kinds name their dtypes in their inputs)."""
    return len({_golden_platform(spec, Pair(d, "torch").context(device)) for d in DTYPE_POLICIES}) > 1


def supports(spec, pair: Pair, device: str) -> bool:
    if pair.backend == "triton" and device == "cpu" and runs_the_engine(spec, device):
        return INTERPRETER_TAG in spec.tags and pair.dtype in INTERPRETER_DTYPES
    return True


def plan(specs, pairs: list[Pair], device: str, world_sizes: tuple[int, ...] = (),
         explicit: bool = False) -> list[tuple]:
    """[(spec, RunContext, golden folder)]: for each spec, one row per golden folder its supported
    pairs read (in the order of `pairs`); `explicit` (one pair named by both options): every spec
    under it. A spec that supports none of the pairs is left out."""
    rows = []
    for spec in specs:
        seen = set()
        for pair in pairs:
            if not explicit and not supports(spec, pair, device):
                continue
            ctx = pair.context(device, world_sizes)
            folder = _golden_platform(spec, ctx)
            if folder not in seen:
                seen.add(folder)
                rows.append((spec, ctx, folder))
    return rows


def describe(pairs: list[Pair]) -> str:
    return ", ".join(p.label for p in pairs)
