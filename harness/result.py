"""What a runner is given (RunContext) and what it returns (SpecResult)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from lockstep.harness.platform import Platform


@dataclass(frozen=True)
class RunContext:
    platform: Platform
    backend: str = "torch"  # kernel backend of the engine: "torch" or "triton"
    world_sizes: tuple[int, ...] = ()  # `--world-size`: also run engine specs at tp = w and ep = w

    @property
    def device(self) -> torch.device:
        return self.platform.torch_device

    @property
    def fixed_platform(self) -> str:
        """Where goldens of specs that never run the model live (kernels, coins): the device with
        the fp32 name, whatever the dtype policy (their inputs carry their own dtype)."""
        return Platform(self.platform.device, "fp32").name

    @property
    def engine_platform(self) -> str:
        """Where goldens of engine runs live: the platform, plus the backend unless it is torch
        (e.g. `cuda-sm90-fp32-triton`): Triton kernels and torch ops round differently."""
        return self.platform.name + ("" if self.backend == "torch" else f"-{self.backend}")


@dataclass
class SpecResult:
    """A run's output. Tensors are compared bitwise with the golden, data with deepdiff.

    `facts` are what the spec's expectations read that do not belong in the golden (e.g. which
    variants of a run disagreed, which depend on command-line options); `notes` are shown to
    the reader and never fail a spec; `located` says where runs that must agree part first."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    facts: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    located: list = field(default_factory=list)  # harness.locate.Located: where a failing comparison parts
