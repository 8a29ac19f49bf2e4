"""MXFP4: the 4-bit block format of gpt-oss's expert weights (DESIGN §7).

A row of the weight is cut into blocks of 32 values along its last axis. Each block stores

  * 16 bytes of packed E2M1 codes: byte b holds element 2b in its LOW nibble and element
    2b+1 in its high nibble. A code is sign (bit 3) and a magnitude index (bits 0-2) into
    E2M1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6];
  * one uint8 E8M0 scale s: the block's values are code_value * 2^(s - 127), except s = 255,
    which encodes NaN for the whole block (OCP MX v1.0: E8M0 has no infinities; 0xFF is NaN).
    A checkpoint loader refuses such a block (engine.checkpoint names the tensor and the index);
    `dequantize` itself returns NaN for every value of it.

This is the format's one definition, at the kernels' floor: the Triton kernels decode it in their
tile loads (kernels/matmul.py `_mxfp4_values`), the references and the engine
(engine/mxfp4.py: packed expert weights, checkpoints) call `dequantize`.

Layout on disk: blocks [..., n_blocks, 16] uint8 and scales [..., n_blocks] uint8, for a
weight [..., n_blocks * 32]. Every decoded value is a short mantissa times a power of two, so
dequantization has one right answer: exact in fp32 and bf16 down to scale 0 (6 * 2^-127 and
0.5 * 2^-127 are subnormal, still exact), and +-inf where it exceeds their range (|code| >= 2
at scale 254: 2 * 2^127 = 2^128).

`quantize` exists to make synthetic MXFP4 checkpoints: per block, the shared exponent is the
smallest e with max|x| / 2^e <= 6 (no value clips), then every value goes to the nearest E2M1
grid point; a value exactly between two grid points goes to the even code (mantissa bit 0),
as IEEE round-half-to-even does: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
"""

from __future__ import annotations

from functools import lru_cache

import torch

BLOCK = 32               # values per block
BYTES_PER_BLOCK = 16     # two 4-bit codes per byte
SCALE_BIAS = 127
NAN_SCALE = 255          # E8M0 0xFF: NaN for the whole block

# Magnitudes of codes 0..7; codes 8..15 are the same with the sign bit set.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_VALUES = E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES)


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """blocks [..., G, 16] u8, scales [..., G] u8 -> values [..., G * 32] in `dtype`."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and {scales.dtype}")
    if blocks.shape[-1] != BYTES_PER_BLOCK or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 shapes disagree: blocks {tuple(blocks.shape)} needs [..., G, 16] "
                         f"and scales [..., G], got scales {tuple(scales.shape)}")
    pairs, powers = _luts(blocks.device)
    values = pairs.index_select(0, blocks.reshape(-1).int()).view(torch.float32)     # lo, hi, lo, hi, ...
    scale = powers.index_select(0, scales.reshape(-1).int()).view(*scales.shape, 1)  # 2^(s - 127)
    values = torch.mul(values.view(*scales.shape, BLOCK), scale)   # [..., G, 32] exact: a short mantissa x 2^e
    values = torch.where((scales == NAN_SCALE).unsqueeze(-1), float("nan"), values)   # whole block NaN
    return values.flatten(-2).to(dtype)                    # [..., G * 32]


@lru_cache(maxsize=None)
def _luts(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables made once per device (a CUDA graph capture may not copy from the host), so that
    decoding is two gathers: `pairs`, the two fp32 values of each byte's codes (E2M1_VALUES of its
    low nibble, then of its high nibble) stored together as one int64 per byte [256] (a gather of
    one 8-byte element per byte, viewed back as the two floats); `powers`, _power_of_two of every
    E8M0 byte [256] fp32."""
    byte = torch.arange(256, dtype=torch.int64)
    values = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    pairs = torch.stack([values[byte & 0x0F], values[byte >> 4]], dim=-1)          # [256, 2]
    return pairs.view(torch.int64).reshape(256).to(device), _power_of_two(byte.to(torch.uint8)).to(device)


def _power_of_two(scales: torch.Tensor) -> torch.Tensor:
    """u8 E8M0 scales -> fp32 2^(s - 127), built from its bits (s = 0 is the subnormal 2^-127;
    s = 255 gives +inf, the NaN block being masked afterwards). Not torch.ldexp: on CUDA that
    multiplies by pow(2, e), which is not exact for every e."""
    s = scales.to(torch.int32)
    bits = torch.where(s == 0, torch.full_like(s, 1 << 22), s << 23)
    return bits.view(torch.float32)


def _nearest_code(magnitude: torch.Tensor) -> torch.Tensor:
    """Index (0..7) of the nearest E2M1 magnitude; a tie goes to the even index."""
    grid = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=magnitude.device)
    dist = (magnitude.unsqueeze(-1) - grid).abs()          # [..., 8]
    best = dist.min(dim=-1, keepdim=True).values
    is_best = dist == best                                 # one or two True (a tie)
    even_best = is_best & (torch.arange(8, device=magnitude.device) % 2 == 0)
    pick = torch.where(even_best.any(-1, keepdim=True), even_best, is_best)
    return pick.to(torch.int64).argmax(dim=-1)             # first True


def quantize(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """values [..., K] (K a multiple of 32) -> (blocks [..., K/32, 16] u8, scales [..., K/32] u8)."""
    if values.shape[-1] % BLOCK:
        raise ValueError(f"MXFP4 needs the last dim to be a multiple of {BLOCK}, got {tuple(values.shape)}")
    x = values.to(torch.float32).reshape(*values.shape[:-1], -1, BLOCK)   # [..., G, 32]
    amax = x.abs().amax(dim=-1)                                            # [..., G]
    # Smallest e with amax / 2^e <= 6. frexp gives amax/6 = m * 2^p with m in [0.5, 1):
    # e = p, except when amax/6 is exactly a power of two (m == 0.5), where e = p - 1.
    mant, p = torch.frexp(amax / 6.0)
    e = torch.where(mant == 0.5, p - 1, p)
    e = torch.where(amax == 0, torch.zeros_like(e), e)
    e = e.clamp(-SCALE_BIAS, 254 - SCALE_BIAS)
    # x * 2^-e by an exact power of two (torch.ldexp's bits on the CPU, and the same on CUDA, where
    # ldexp multiplies by pow(2, e)); -e is in [-127, 127], so 2^-e is an E8M0 value
    scaled = torch.mul(x, _power_of_two((SCALE_BIAS - e).to(torch.uint8)).unsqueeze(-1))   # [..., G, 32], |.| <= 6
    code = _nearest_code(scaled.abs().clamp(max=6.0))
    code = code + 8 * (scaled < 0).to(torch.int64)                         # sign bit; -0 -> code 0
    code = torch.where(code == 8, torch.zeros_like(code), code)
    code = code.to(torch.uint8).reshape(*code.shape[:-1], BYTES_PER_BLOCK, 2)
    blocks = code[..., 0] | (code[..., 1] << 4)                            # low nibble = even
    scales = (e + SCALE_BIAS).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()
