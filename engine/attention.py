"""Attention with sinks and an optional sliding window, read from the KV cache (DESIGN §7).

For query head h (KV head h // G, G = q_heads / kv_heads) at position p:

    s_j = (q . k_j) * scale          for visible keys j: j <= p, and j > p - window if windowed
    out = sum_j softmax([s_j..., sink_h])_j * v_j      (the sink column is dropped afterwards)

How it stays deterministic (DESIGN §2), for the whole batch in one pass:

    s_j    = tree_sum_d(q_d * k_jd) * scale                      fixed tree over head_dim
    m      = max(sink, max over visible j of s_j)                exact
    p_j    = exp(s_j - m), 0 where not visible                   kernels.portable.exp
    l      = e^(sink - m) + T_0 + T_1 + ...                      T_t = tree_sum over tile t
    acc    = A_0 + A_1 + ...                                     A_t = tree_sum over tile t of p_j v_j
    out    = acc / l

Keys are cut into fixed tiles of KV_TILE positions; within a tile the sum is the fixed tree,
and the tiles are added first to last. Every operation is elementwise over (query, head), so
a query's bits depend only on the query, its slot's cache and its position: not on its
batchmates (D2), not on prefill, chunk or decode step (D3), nor on the CPU (D0). A tile with
no visible key (outside the window, or in the causal future; DESIGN §8 "empty tile") adds
+0.0, which leaves the sums unchanged, so the result is also independent of the cache capacity.
"""

from __future__ import annotations

import torch

from kernels.portable import exp, tree_sum

KV_TILE = 32   # key positions per tile; the cache capacity is a multiple of it


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              slots: torch.Tensor, positions: torch.Tensor, sinks: torch.Tensor,
              window: int, scale: float) -> torch.Tensor:
    """q [T, Hq, D]; k_cache, v_cache [slots, Hkv, S, D]; slots, positions [T] int64;
    sinks [Hq]; window 0 = full causal. -> [T, Hq, D] in q's dtype, computed in fp32.
    (The Triton ops take kernels.attention.attention_triton: 64-key tiles in fixed 1024-key splits.)"""
    T, Hq, D = q.shape
    S = k_cache.shape[2]
    if S % KV_TILE:
        raise ValueError(f"attention: cache capacity {S} is not a multiple of KV_TILE={KV_TILE}")
    if T == 0:
        return q.new_empty((0, Hq, D))
    out = q.new_empty((T, Hq, D))                                        # q's dtype
    rows = max(1, _CHUNK_ELEMENTS // (Hq * S * D))                       # memory bound only
    for t0 in range(0, T, rows):
        t1 = min(T, t0 + rows)
        out[t0:t1] = _attend(q[t0:t1], k_cache, v_cache, slots[t0:t1], positions[t0:t1],
                             sinks, window, scale)
    return out


_CHUNK_ELEMENTS = 1 << 23


def _attend(q, k_cache, v_cache, slots, positions, sinks, window, scale) -> torch.Tensor:
    """The module docstring's recipe for the queries q [T, Hq, D] -> [T, Hq, D]."""
    T, Hq, D = q.shape
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    G = Hq // Hkv
    keys = k_cache.index_select(0, slots).to(torch.float32)              # [T, Hkv, S, D]
    values = v_cache.index_select(0, slots).to(torch.float32)            # [T, Hkv, S, D]
    qg = q.to(torch.float32).reshape(T, Hkv, G, 1, D)                                       # head h = kv * G + g
    s = tree_sum(torch.mul(qg, keys[:, :, None]), -1)                     # [T, Hkv, G, S]
    s = torch.mul(s, scale)
    j = torch.arange(S, dtype=torch.int64, device=q.device)
    pos = positions[:, None]                                              # [T, 1]
    visible = j[None, :] <= pos                                           # [T, S]
    if window > 0:
        visible = visible & (j[None, :] > pos - window)
    visible = visible[:, None, None, :]                                   # [T, 1, 1, S]
    sink = sinks.to(torch.float32).reshape(1, Hkv, G, 1)
    s = torch.where(visible, s, float("-inf"))
    m = torch.maximum(s.amax(dim=-1, keepdim=True), sink)                 # [T, Hkv, G, 1]
    p = torch.where(visible, exp(torch.sub(s, m)), 0.0)                   # [T, Hkv, G, S]
    n_tiles = S // KV_TILE
    p_tiles = p.reshape(T, Hkv, G, n_tiles, KV_TILE)
    pv = torch.mul(p_tiles[..., None], values.reshape(T, Hkv, 1, n_tiles, KV_TILE, D))
    l_tiles = tree_sum(p_tiles, -1)                                       # [T, Hkv, G, n_tiles]
    acc_tiles = tree_sum(pv, -2)                                          # [T, Hkv, G, n_tiles, D]
    l = exp(torch.sub(sink, m))[..., 0]                                   # [T, Hkv, G]
    acc = acc_tiles[..., 0, :]
    for t in range(n_tiles):                                              # tiles first to last
        l = torch.add(l, l_tiles[..., t])
        if t > 0:
            acc = torch.add(acc, acc_tiles[..., t, :])
    return torch.div(acc, l[..., None]).reshape(T, Hq, D).to(q.dtype)
