"""The torch reference of the engine's row-wise ops: RMSNorm, top-k, the routing softmax, SwiGLU.

Each is built from single IEEE operations and fixed trees (kernels/portable.py), so a row's bits
depend on that row alone (D2, D3) and on no CPU feature (D0). These are the "torch" entries of
the ops table (engine/ops.py); the Triton kernels there compute the same contracts.
"""

from __future__ import annotations

import torch

from kernels import portable


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """x [T, H] -> x / sqrt(mean(x^2) + eps) * weight, in fp32 (the mean a fixed tree over H),
    rounded once to out_dtype."""
    return portable.rms_norm(x.to(torch.float32), weight, eps).to(out_dtype)


def routing_weights(top_logits: torch.Tensor) -> torch.Tensor:
    """top_logits [T, k] fp32 -> softmax over the k selected logits, [T, k] (portable exp, fixed tree)."""
    return portable.softmax(top_logits, dim=-1)


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    """gate_up [T, 2I], interleaved (gate = even columns, up = odd) -> [T, I] in gate_up's dtype:
    (gate * sigmoid(alpha * gate)) * (up + 1) in fp32, the sigmoid portable (float64, rounded
    once), the result rounded once to gate_up's dtype."""
    x = gate_up.to(torch.float32)
    gate = x[..., 0::2].clamp(max=limit)
    up = x[..., 1::2].clamp(min=-limit, max=limit)
    y = torch.mul(torch.mul(gate, portable.sigmoid(torch.mul(gate, alpha))), torch.add(up, 1.0))
    return y.to(gate_up.dtype)


def top_k_lowest_index(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k along the last dim; equal values rank by lower index. -> (values, ids) [..., k]."""
    values, ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    return values[..., :k], ids[..., :k]


def route(router_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits [T, E] fp32 -> (routing [T, k] fp32, top_ids [T, k]): the top k (ties to the
    lower id) and the portable softmax over them."""
    top_logits, top_ids = top_k_lowest_index(router_logits, k)
    return routing_weights(top_logits), top_ids
