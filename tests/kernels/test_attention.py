"""kernels.attention: sinks, sliding window, GQA; empty tiles; prefill == decode bitwise."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import kernels.attention as A
from kernels.attention import BLOCK_KV, attention
from tests.kernels.conftest import DEVICE

# Stated tolerance against the plain torch reference (whole-row softmax): fp32 2e-5 absolute
# (values are O(1)); bf16 inputs/outputs 2e-2.
ATOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def setup(Hq, Hkv, D, S, slots=1, seed=0, dtype=torch.float32, qscale=1.0):
    """q, k_cache, v_cache, sinks made on the CPU (the same values everywhere), on DEVICE."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(slots, Hkv, S, D, generator=g).to(dtype)
    v = torch.randn(slots, Hkv, S, D, generator=g).to(dtype)
    sinks = torch.randn(Hq, generator=g)
    q = (torch.randn(S * slots, Hq, D, generator=g) * qscale).to(dtype)
    return q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), sinks.to(DEVICE)


def ints(*values):
    """An int64 index tensor (positions, slots) on DEVICE."""
    return torch.tensor(values, dtype=torch.int64, device=DEVICE)


def zeros(n):
    return torch.zeros(n, dtype=torch.int64, device=DEVICE)


def both(q, k, v, slots, pos, sinks, window, scale=0.125):
    """Triton kernel and torch reference on the same (DEVICE) inputs."""
    out = attention(q, k, v, slots, pos, sinks, window, scale, backend="triton")
    ref = attention(q, k, v, slots, pos, sinks, window, scale)
    return out, ref


def bits(t):
    return t.contiguous().view(torch.uint8)


@settings(max_examples=10, deadline=None)
@given(Hkv=st.sampled_from([1, 2]), G=st.sampled_from([1, 2, 8]), D=st.sampled_from([16, 64]),
       window=st.sampled_from([0, 1, 3, 64, 128]), T=st.integers(1, 6), seed=st.integers(0, 1000))
def test_property_agrees_with_reference(Hkv, G, D, window, T, seed):
    S = 160
    q, k, v, sinks = setup(Hq=Hkv * G, Hkv=Hkv, D=D, S=S, slots=2, seed=seed)
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, S, (T,), generator=g).to(DEVICE)
    slots = torch.randint(0, 2, (T,), generator=g).to(DEVICE)
    out, ref = both(q[:T], k, v, slots, pos, sinks, window, 1 / math.sqrt(D))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=0, atol=ATOL[torch.float32])


PROMPT_LENGTHS = [191, 192, 193, 200, 255, 256, 257, 319, 320, 384, 447, 520]


def test_empty_tiles_long_prompts_window_128():
    """DESIGN §8 / seed 002: prompts of 191..520 tokens with window 128 and 64-wide tiles.
    The last token of each prompt visits a tile wholly before its window from length 192 on."""
    S = 576
    q, k, v, sinks = setup(Hq=8, Hkv=1, D=64, S=S, seed=1)
    pos = ints(*[n - 1 for n in PROMPT_LENGTHS])
    slots = zeros(len(pos))
    out, ref = both(q[:len(pos)], k, v, slots, pos, sinks, 128)
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, rtol=0, atol=ATOL[torch.float32])
    for i in range(len(pos)):       # each as a decode step: bitwise the same
        alone = attention(q[i:i + 1], k, v, slots[:1], pos[i:i + 1], sinks, 128, 0.125, backend="triton")
        assert bits(alone).equal(bits(out[i:i + 1])), PROMPT_LENGTHS[i]


@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_the_empty_tile_bug_is_caught(monkeypatch):
    """Putting the seed bug back (m_use = m_new) must turn the check above red."""
    monkeypatch.setattr(A, "_GUARD_EMPTY_TILES", False)
    S = 320
    q, k, v, sinks = setup(Hq=2, Hkv=1, D=16, S=S, seed=2)
    pos = ints(150, 190, 191, 255)               # p = 63 mod 64, p >= 191: an empty first tile
    out, ref = both(q[:4], k, v, zeros(4), pos, sinks, 128)
    assert torch.allclose(out[:2], ref[:2], atol=2e-5)          # no empty tile yet
    assert out[2:].isnan().all()                                 # poisoned


def test_prefill_chunked_and_decode_are_bitwise_equal():
    """D3: positions 0..199 in one prefill, in chunks of 37, and one token at a time."""
    T = 200
    q, k, v, sinks = setup(Hq=4, Hkv=1, D=32, S=256, seed=3)
    q = q[:T]
    pos = torch.arange(T, device=DEVICE)
    slots = zeros(T)
    for window in (128, 0):
        full = attention(q, k, v, slots, pos, sinks, window, 0.2, backend="triton")
        chunked = torch.cat([attention(q[i:i + 37], k, v, slots[i:i + 37], pos[i:i + 37], sinks, window, 0.2,
                                       backend="triton") for i in range(0, T, 37)])
        assert bits(full).equal(bits(chunked))
        for t in (0, 63, 64, 127, 128, 190, 191, 192, 199):
            one = attention(q[t:t + 1], k, v, slots[:1], pos[t:t + 1], sinks, window, 0.2, backend="triton")
            assert bits(one).equal(bits(full[t:t + 1])), (window, t)


def test_decode_does_not_see_the_future_cache():
    """Prefill writes the whole prompt before attention; decode has zeros after p. Same bits."""
    q, k, v, sinks = setup(Hq=2, Hkv=1, D=16, S=128, seed=4)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 71:] = 0
    v2[:, :, 71:] = 0
    p = ints(70)
    s = zeros(1)
    for window in (0, 8):
        a = attention(q[:1], k, v, s, p, sinks, window, 0.25, backend="triton")
        b = attention(q[:1], k2, v2, s, p, sinks, window, 0.25, backend="triton")
        assert bits(a).equal(bits(b))


def test_batch_mates_do_not_change_a_row():
    """D2: a token's output alone and inside a batch mixing slots and positions."""
    q, k, v, sinks = setup(Hq=4, Hkv=2, D=32, S=192, slots=3, seed=5)
    pos = ints(5, 130, 64, 191, 0, 77)
    slots = ints(0, 1, 2, 0, 1, 2)
    batch = attention(q[:6], k, v, slots, pos, sinks, 128, 0.17, backend="triton")
    for i in range(6):
        alone = attention(q[i:i + 1], k, v, slots[i:i + 1], pos[i:i + 1], sinks, 128, 0.17, backend="triton")
        assert bits(alone).equal(bits(batch[i:i + 1]))


def test_single_token_and_all_masked_rows():
    q, k, v, sinks = setup(Hq=2, Hkv=1, D=16, S=64, seed=6)
    s1 = zeros(1)
    out, ref = both(q[:1], k, v, s1, ints(0), sinks, 0)
    torch.testing.assert_close(out, ref, rtol=0, atol=2e-5)
    # window 4 at position 100 of a 64-key cache: every key is masked -> exactly 0, finite
    out, ref = both(q[:1], k, v, s1, ints(100), sinks, 4)
    assert out.eq(0).all() and ref.eq(0).all()
    out, _ = both(q[:1], k, v, s1, ints(100), torch.full((2,), float("-inf"), device=DEVICE), 4)
    assert out.eq(0).all()                                           # no keys, no sink: 0, not NaN


def test_dominating_and_absent_sinks():
    q, k, v, _ = setup(Hq=4, Hkv=2, D=32, S=128, seed=7)
    pos, slots = ints(0, 10, 127), zeros(3)
    big = torch.full((4,), 80.0, device=DEVICE)
    out, ref = both(q[:3], k, v, slots, pos, big, 0)
    assert torch.isfinite(out).all() and out.abs().max() < 1e-20
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-30)
    none = torch.full((4,), float("-inf"), device=DEVICE)
    out, ref = both(q[:3], k, v, slots, pos, none, 16)
    torch.testing.assert_close(out, ref, rtol=0, atol=2e-5)
    # one key, no sink: the output is that value row exactly (softmax of one logit is 1)
    assert out[0].reshape(2, 2, 32).sub(v[0, :, 0][:, None, :]).abs().max() < 1e-6


@pytest.mark.parametrize("qscale", [1e3, 1e-30])
def test_very_large_and_small_logits(qscale):
    q, k, v, sinks = setup(Hq=4, Hkv=1, D=32, S=128, seed=8, qscale=qscale)
    pos, slots = ints(3, 64, 127), zeros(3)
    out, ref = both(q[:3], k, v, slots, pos, sinks, 64)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-4)


def test_bf16_inputs():
    q, k, v, sinks = setup(Hq=8, Hkv=1, D=64, S=256, seed=9, dtype=torch.bfloat16)
    pos, slots = ints(0, 100, 191, 255), zeros(4)
    out, ref = both(q[:4], k, v, slots, pos, sinks, 128)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    torch.testing.assert_close(out.float(), ref.float(), rtol=0, atol=ATOL[torch.bfloat16])


def test_tile_size_is_fixed():
    assert BLOCK_KV == 64
