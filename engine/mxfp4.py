"""MXFP4 expert weights in the engine: kept packed on the device, decoded inside the expert
matmuls. The format itself (blocks of 32 E2M1 codes with an E8M0 scale, DESIGN §7) is defined once
in kernels/mxfp4.py; its names are re-exported here for the engine's callers."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import torch

from lockstep.kernels.mxfp4 import (BLOCK, BYTES_PER_BLOCK, E2M1_MAGNITUDES, E2M1_VALUES, NAN_SCALE,  # noqa: F401
                           SCALE_BIAS, dequantize, quantize)


class Mxfp4Weight(NamedTuple):
    """An [E, N, K] expert weight kept packed on its device (the engine decodes it inside the
    expert matmuls): blocks [E, N, K/32, 16] uint8, scales [E, N, K/32] uint8."""
    blocks: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> tuple[int, int, int]:
        E, N, G, _ = self.blocks.shape
        return (E, N, G * BLOCK)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense [len(ids), N, K] weights of experts `ids` (exact in fp32 and bf16)."""
        return dequantize(self.blocks.index_select(0, ids), self.scales.index_select(0, ids), dtype)


@dataclass(frozen=True)
class Mxfp4Columns:
    """Columns [lo, lo + width) of the K axis of a packed [E, N, K] expert weight, held as the whole
    blocks that cover them (a tensor-parallel rank's K range that does not fall on the block grid).
    Not a tuple, so never taken for an Mxfp4Weight: kernels that read whole blocks get it decoded."""
    blocks: torch.Tensor
    scales: torch.Tensor
    lo: int
    width: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.blocks.shape[0], self.blocks.shape[1], self.width)

    def to(self, device) -> "Mxfp4Columns":
        return replace(self, blocks=self.blocks.to(device), scales=self.scales.to(device))

    def rows(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense [len(ids), N, width] weights of experts `ids` (exact in fp32 and bf16)."""
        w = dequantize(self.blocks.index_select(0, ids), self.scales.index_select(0, ids), dtype)
        return w[:, :, self.lo:self.lo + self.width].contiguous()

    def dense(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Every expert's [E, N, width] weights, decoded."""
        return self.rows(torch.arange(self.blocks.shape[0], device=self.blocks.device), dtype)
