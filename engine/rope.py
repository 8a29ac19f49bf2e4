"""Rotary position embedding with YaRN scaling, half-split (NeoX) rotation (DESIGN §7).

YaRN ("NTK by parts"): frequency i of head_dim/2 is blended between the original
(extrapolation) frequency 1/theta^(2i/d) and the interpolated one (that divided by
`factor`), with a linear ramp over the dimension range [low, high] where

    low, high = d * ln(original_ctx / (beta * 2 pi)) / (2 ln theta)   for beta_fast, beta_slow

(floored / ceiled when `truncate`, then clamped to [0, d - 1], as HF does). cos and sin are
fp32 and both multiplied by mscale = 0.1 * ln(factor) + 1, so the attention logits grow by
mscale^2.

Portability (D0): torch's pow, sin and cos (and libm's log behind `math.log`) are not the same
function on every CPU, so the frequencies theta^(-2i/d) = exp(-(2i/d) ln theta), the YaRN
bounds, mscale, and sin / cos of the fp32 angles are all evaluated by kernels.portable in
float64 and rounded once to fp32.
"""

from __future__ import annotations

import math

import torch

from lockstep.engine.config import RopeParams
from lockstep.kernels.portable import exp64, log64, scalar_log, sincos64


def rope_frequencies(head_dim: int, rope: RopeParams) -> tuple[torch.Tensor, float]:
    """-> (inv_freq [head_dim / 2] fp32, mscale)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim         # exact
    log_theta = log64(torch.tensor([float(rope.theta)], dtype=torch.float64))
    pos_freqs = exp64(torch.mul(exponents, log_theta)).to(torch.float32)          # theta^(2i/d), [d/2]
    if rope.rope_type == "default" or rope.factor == 1.0:
        return 1.0 / pos_freqs, 1.0

    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (rope.factor * pos_freqs)

    def correction_dim(num_rotations: float) -> float:
        ctx = rope.original_max_position_embeddings
        return head_dim * scalar_log(ctx / (num_rotations * 2 * math.pi)) / (2 * scalar_log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp                 # 1 for fast (high-frequency) dims
    inv_freq = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
    mscale = 0.1 * scalar_log(rope.factor) + 1.0
    return inv_freq, mscale


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, mscale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T] int64 -> cos, sin [T, head_dim / 2] fp32, each already times mscale."""
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]   # one rounded fp32 product each
    sin, cos = sincos64(angles)                                         # float64, from the fp32 angles
    return cos.to(torch.float32) * mscale, sin.to(torch.float32) * mscale
