"""What a runner is given (RunContext) and what it returns (Result)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.platform import Platform


@dataclass(frozen=True)
class RunContext:
    platform: Platform
    backend: str = "torch"  # kernel backend of the engine: "torch" or "triton"

    @property
    def device(self) -> torch.device:
        return self.platform.torch_device


@dataclass
class Result:
    """A run's output. Tensors are compared bitwise with the golden, data with deepdiff."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    data: dict = field(default_factory=dict)
