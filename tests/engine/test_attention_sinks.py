import math

import pytest
import torch

from lockstep.kernels.attention import KV_TILE, attention_portable as attention


def naive_attention(q, k, v, sinks, window, scale):
    """float64 reference for one sequence: q, k, v [T, heads, D] (kv heads repeated per group)."""
    T, Hq, D = q.shape
    G = Hq // k.shape[1]
    k = k.double().repeat_interleave(G, dim=1)
    v = v.double().repeat_interleave(G, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.double(), k) * scale             # [Hq, T, T]
    qi, ki = torch.arange(T)[:, None], torch.arange(T)[None, :]
    visible = ki <= qi
    if window:
        visible &= ki > qi - window
    s = s.masked_fill(~visible, float("-inf"))
    s = torch.cat([s, sinks.double()[:, None, None].expand(Hq, T, 1)], dim=-1)
    w = torch.softmax(s, dim=-1)[..., :-1]
    return torch.einsum("hqk,khd->qhd", w, v)


def setup(T, Hq=4, Hkv=2, D=16, capacity=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(T, h, D, generator=g) for h in (Hq, Hkv, Hkv))
    sinks = torch.randn(Hq, generator=g)
    S = capacity or -(-T // KV_TILE) * KV_TILE
    kc, vc = torch.zeros(2, Hkv, S, D), torch.zeros(2, Hkv, S, D)
    kc[1, :, :T] = k.transpose(0, 1)                                    # the sequence lives in slot 1
    vc[1, :, :T] = v.transpose(0, 1)
    return q, k, v, sinks, kc, vc


@pytest.mark.parametrize("window", [0, 1, 8, 40])
def test_matches_float64_reference(window):
    T = 150                                      # several tiles; tiles wholly outside the window
    q, k, v, sinks, kc, vc = setup(T)
    out = attention(q, kc, vc, torch.ones(T, dtype=torch.int64), torch.arange(T), sinks, window, 0.25)
    ref = naive_attention(q, k, v, sinks, window, 0.25)
    assert torch.isfinite(out).all()
    assert torch.allclose(out.double(), ref, atol=2e-6, rtol=1e-5)


def test_sink_takes_mass_without_value():
    # one visible key: out = v * e^s / (e^s + e^sink)
    q = torch.zeros(1, 1, 4)
    kc, vc = torch.zeros(1, 1, KV_TILE, 4), torch.zeros(1, 1, KV_TILE, 4)
    vc[0, 0, 0] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    out = attention(q, kc, vc, torch.zeros(1, dtype=torch.int64), torch.zeros(1, dtype=torch.int64),
                    torch.tensor([math.log(3.0)]), 0, 1.0)
    assert torch.allclose(out[0, 0], torch.tensor([1.0, 2.0, 3.0, 4.0]) / 4)


def test_bits_do_not_depend_on_capacity_batchmates_or_garbage_after_the_query():
    T = 70
    q, k, v, sinks, kc, vc = setup(T, capacity=96)
    slots, pos = torch.ones(T, dtype=torch.int64), torch.arange(T)
    out = attention(q, kc, vc, slots, pos, sinks, 8, 0.25)
    _, _, _, _, kc2, vc2 = setup(T, capacity=320)                        # more (empty) tiles
    kc2[0] = torch.randn(kc2[0].shape)                                  # another request's slot
    assert attention(q, kc2, vc2, slots, pos, sinks, 8, 0.25).equal(out)
    for t in (0, 5, 37, 69):                                            # one query alone, future keys missing
        kc3, vc3 = kc.clone(), vc.clone()
        kc3[1, :, t + 1:], vc3[1, :, t + 1:] = 0, 0
        one = attention(q[t:t + 1], kc3, vc3, slots[:1], pos[t:t + 1], sinks, 8, 0.25)
        assert one[0].equal(out[t]), t


def test_rejects_capacity_that_is_not_whole_tiles():
    q, _, _, sinks, _, _ = setup(3)
    bad = torch.zeros(1, 2, KV_TILE + 1, 16)
    with pytest.raises(ValueError, match="KV_TILE"):
        attention(q, bad, bad, torch.zeros(3, dtype=torch.int64), torch.arange(3), sinks, 0, 1.0)
