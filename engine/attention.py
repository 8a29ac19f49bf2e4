"""Attention with sinks and an optional sliding window, read from the KV cache (DESIGN §7).

For query head h (KV head h // G, G = q_heads / kv_heads) at position p:

    s_j = (q . k_j) * scale          for visible keys j: j <= p, and j > p - window if windowed
    out = sum_j softmax([s_j..., sink_h])_j * v_j      (the sink column is dropped afterwards)

How it stays deterministic (DESIGN §2): each query is computed on its own, and its keys are
walked in fixed tiles of KV_TILE positions, first to last, merging with the online-softmax
update. Every tile call has the same shapes, so the bits depend only on the query, its slot's
cache and its position: not on batchmates (D2), and not on whether it ran in a prefill, a
chunk or a decode step (D3), because all three take this one path.

The running max starts at the sink logit (never -inf), so a tile with no visible key (outside
the window, or in the causal future; DESIGN §8 "empty tile") gives p = exp(-inf) = 0 and a
rescale exp(0) = 1: the merge leaves the state bit-identical. That also makes the result
independent of the cache capacity (trailing empty tiles are no-ops).
"""

from __future__ import annotations

import torch

from kernels import check_backend

KV_TILE = 32   # key positions per tile; the cache capacity is a multiple of it


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              slots: torch.Tensor, positions: torch.Tensor, sinks: torch.Tensor,
              window: int, scale: float, backend: str = "torch") -> torch.Tensor:
    """q [T, Hq, D]; k_cache, v_cache [slots, Hkv, S, D]; slots, positions [T] int64;
    sinks [Hq]; window 0 = full causal. -> [T, Hq, D] fp32."""
    if check_backend(backend) == "triton":
        from kernels.attention import attention_triton    # one fixed 64-key split, prefill = decode
        return attention_triton(q, k_cache, v_cache, slots, positions, sinks, window, scale)
    T, Hq, D = q.shape
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    if S % KV_TILE:
        raise ValueError(f"attention: cache capacity {S} is not a multiple of KV_TILE={KV_TILE}")
    sink_logits = sinks.to(torch.float32).reshape(Hkv, G, 1)
    tile_offsets = torch.arange(KV_TILE, dtype=torch.int64, device=q.device)
    out = q.new_empty((T, Hq, D))
    for t in range(T):
        qt = q[t].reshape(Hkv, G, D)                                  # query head h = kv * G + g
        keys = k_cache.index_select(0, slots[t:t + 1])[0]            # [Hkv, S, D]
        values = v_cache.index_select(0, slots[t:t + 1])[0]          # [Hkv, S, D]
        pos = positions[t]                                            # 0-dim tensor, no .item()
        m = sink_logits                                               # running max     [Hkv, G, 1]
        l = torch.ones_like(sink_logits)                              # running sum (sink: exp(0))
        acc = q.new_zeros((Hkv, G, D))                                # running output
        for start in range(0, S, KV_TILE):
            k_tile = keys[:, start:start + KV_TILE]                   # [Hkv, KV_TILE, D]
            v_tile = values[:, start:start + KV_TILE]
            s = torch.matmul(qt, k_tile.transpose(1, 2)) * scale         # [Hkv, G, KV_TILE]
            j = start + tile_offsets
            visible = j <= pos
            if window > 0:
                visible = visible & (j > pos - window)
            s = torch.where(visible, s, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            rescale = torch.exp(m - m_new)
            p = torch.exp(s - m_new)                                  # 0 where not visible
            l = l * rescale + p.sum(dim=-1, keepdim=True)
            acc = acc * rescale + torch.matmul(p, v_tile)                # [Hkv, G, D]
            m = m_new
        out[t] = (acc / l).reshape(Hq, D)
    return out
