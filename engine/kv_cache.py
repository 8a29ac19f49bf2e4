"""The preallocated KV cache: one [slots, kv_heads, capacity, head_dim] buffer per layer.

The per-layer buffers are views of one stacked [layers, slots, kv_heads, capacity, head_dim]
tensor (k_all, v_all), so that a copy between slots (engine.speculative's scratch slots) is one
indexed copy over every layer at once.

A request owns one slot for its lifetime; the key and value of its token at position p live
at [slot, :, p, :]. The capacity is rounded up to whole attention tiles (KV_TILE), because
attention walks the whole slot tile by tile with a mask (static shapes, no host sync).
Buffers start at zero, so a key or value slot that was never written is finite and masks
out to an exact zero contribution.
"""

from __future__ import annotations

import torch

from lockstep.engine.config import GptOssConfig
from lockstep.kernels.attention import KV_TILE


class KVCache:
    def __init__(self, config: GptOssConfig, num_slots: int, max_seq_len: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        if num_slots < 1 or max_seq_len < 1:
            raise ValueError(f"KVCache needs num_slots >= 1 and max_seq_len >= 1, got {num_slots}, {max_seq_len}")
        self.num_slots = num_slots
        self.capacity = -(-max_seq_len // KV_TILE) * KV_TILE
        shape = (num_slots, config.num_key_value_heads, self.capacity, config.head_dim)
        L = config.num_hidden_layers
        self.k_all = torch.zeros((L, *shape), dtype=dtype, device=device)
        self.v_all = torch.zeros((L, *shape), dtype=dtype, device=device)
        self.k = list(self.k_all.unbind(0))             # views: writes land in k_all / v_all
        self.v = list(self.v_all.unbind(0))

    def write(self, layer: int, slots: torch.Tensor, positions: torch.Tensor,
              k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [T, kv_heads, D] go to (slots[t], positions[t]); no host sync."""
        self.k[layer][slots, :, positions] = k
        self.v[layer][slots, :, positions] = v

    def copy_prefix(self, dst: torch.Tensor, src: torch.Tensor, length: int) -> None:
        """Positions 0 .. length-1 of slots src[m] -> slots dst[m], every layer, one indexed copy
        each for keys and values (dst distinct; no host sync)."""
        for buf in (self.k_all, self.v_all):
            buf[:, dst, :, :length] = buf[:, src, :, :length]

    def copy_positions(self, dst: torch.Tensor, src: torch.Tensor, positions: torch.Tensor) -> None:
        """(src[m], positions[m, j]) -> (dst[m], positions[m, j]) for every layer: one gather and
        one scatter each for keys and values (the (dst, position) pairs distinct; no host sync)."""
        d, s = dst[:, None], src[:, None]
        for buf in (self.k_all, self.v_all):
            buf[:, d, :, positions] = buf[:, s, :, positions]

    def clear_slot(self, slot: int) -> None:
        for buf in self.k + self.v:
            buf[slot].zero_()
