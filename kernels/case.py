"""A kernel's case: how the `kernel` spec kind runs it, declared beside the kernel.

Each kernel module ends with `CASES = (KernelCase(...), ...)`: the spec's `inputs.kernel` name
(also the target operation's name), the shape keys it needs, how its inputs are drawn from the
spec's seed, how the operation is called on some rows, its one torch reference, and Lockstep's
implementation of the operation. `kernel_cases()` finds every module's CASES; the engine adds the
paths it pins as kernels (engine/cases.py). A spec's inputs reach the hooks as a dict (its
`inputs`, an integer sequence already a tensor) and its shape as a dict of ints.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Callable

import torch

from lockstep.kernels import portable


def _no_problems(inputs: dict, shape: dict) -> list:
    return []


@dataclass(frozen=True)
class KernelCase:
    """One operation the `kernel` kind compares with its torch reference (module docstring).
    Every callable looks up the module's functions when called, so a planted fault is what runs."""
    name: str                          # spec `inputs.kernel` and the target operation's name
    dims: tuple[str, ...]              # the shape keys a spec must give
    inputs: Callable                   # (inputs, shape, Draw) -> the tensors and scalars of a run
    call: Callable                     # (op, x, rows: slice, offered: set of features) -> output rows
    reference: Callable                # x -> the torch reference's output, in `call`'s form
    op: Callable                       # Lockstep's implementation of the target operation
    elements: Callable                 # shape -> about how many elements a run allocates
    note: str = ""                     # how the operation reaches the implementation (`list --target`)
    options: tuple[str, ...] = ()      # the kind's optional inputs this kernel takes (sink, rows, …)
    optional_dims: tuple[str, ...] = ()     # shape keys it may take besides `dims`
    features: tuple[str, ...] = ()     # optional features of the operation, each named as the input needing it
    expects: tuple[str, ...] = ()      # expectations only this kernel has (prefill_decode)
    problems: Callable = field(default=_no_problems)   # (inputs, shape) -> [(path under inputs, message)]
    interface: bool = False            # an operation base.py documents for every target (else Lockstep's own)
    # A target without this case's operation runs its `form` instead: another case on the same inputs
    # through an interface operation, judged on part of the output (sample_fused: its tokens through
    # `sampling` with params). A form's operation must offer `needs`, and the target must declare `rng`
    # (harness.target.RNG_MODELS) where the bits depend on the seeded-sampling contract.
    form: "KernelCase | None" = None
    needs: tuple[str, ...] = ()        # features the operation must offer for this case
    rng: str | None = None             # the RNG model a target must declare (Target.rng) to run it
    explain: Callable | None = None    # (x, row, got) -> the cause of row `row`'s bitwise mismatch, first

    def needed_dims(self, inputs: dict) -> tuple[str, ...]:
        """The shape keys this spec must give (`T` is the count of `positions` when they are given)."""
        return self.dims + tuple(d for d in self.optional_dims if d == "T" and inputs.get("positions") is None)


class Draw:
    """A spec's inputs drawn from its seed: portable normals (torch.randn is not portable) in the
    spec's dtype, on the run's device, and the generator for any other draw."""

    def __init__(self, seed: int, dtype: torch.dtype, device):
        self.g, self.dtype, self.device = torch.Generator().manual_seed(seed), dtype, device

    def normal(self, *shape, scale=1.0, dtype=None) -> torch.Tensor:
        return (portable.normal(shape, self.g) * scale).to(dtype or self.dtype).to(self.device)


def rows_problems(inputs: dict, shape: dict) -> list:
    """`rows` of a sampling spec: R of them, each one's `logits` a mapping of quoted vocab ids to numbers."""
    out = []
    if inputs.get("rows") is None:
        return out
    if len(inputs["rows"]) != shape["R"]:
        out.append((("rows",), f"expected R = {shape['R']} rows, found {len(inputs['rows'])}"))
    for i, row in enumerate(inputs["rows"]):
        lg = row["logits"]
        if lg is None:
            continue
        if not isinstance(lg, dict) or not lg or any(not _vocab_key(k, shape["V"]) for k in lg) \
                or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in lg.values()):
            out.append((("rows", i, "logits"), f"expected a mapping of vocab ids in [0, {shape['V']}), written as "
                                               f"quoted keys ('6': 0.0), to numbers"))
    return out


def _vocab_key(key, V: int) -> bool:
    """A vocab id written as a mapping key: a quoted decimal integer (YAML keys must be strings)."""
    return isinstance(key, str) and key.isdigit() and int(key) < V


def kernel_cases() -> list[KernelCase]:
    """Every CASES of the modules of this package, in module-name order."""
    package = importlib.import_module(__name__.rpartition(".")[0])
    found = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not info.name.startswith("_") and info.name != "case":
            found += getattr(importlib.import_module(f"{package.__name__}.{info.name}"), "CASES", ())
    return found
