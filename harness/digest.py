"""Digests of bytes and tensors, shared by the golden store and the kinds that record digests
(a leaf module: it imports nothing of the harness)."""

from __future__ import annotations

import hashlib

import torch


def sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def standard(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy with standard strides: `.contiguous()` keeps odd strides of size-1 dimensions,
    which a byte view refuses."""
    return t.detach().cpu().clone(memory_format=torch.contiguous_format)


def tensor_sha256(t: torch.Tensor) -> str:
    t = standard(t)
    return sha256(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
