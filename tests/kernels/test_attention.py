"""lockstep.kernels.attention: sinks, sliding window, GQA; empty tiles; splits; prefill == decode bitwise."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from lockstep.kernels.attention import BLOCK_KV, SPLIT, attention_portable, attention_triton, split_grid
from tests.kernels.conftest import DEVICE

# Stated tolerance against the bit-exact torch reference attention_portable (fixed 32-key tiles,
# the torch ops' attention): fp32 2e-5 absolute (values are O(1)); bf16 inputs/outputs 2e-2.
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


def both(q, k, v, slots, pos, sinks, window, scale=0.125, **kw):
    """Triton kernel (kw: its test keywords) and torch reference on the same (DEVICE) inputs."""
    out = attention_triton(q, k, v, slots, pos, sinks, window, scale, **kw)
    ref = attention_portable(q, k, v, slots, pos, sinks, window, scale)
    return out, ref


def bits(t):
    return t.contiguous().view(torch.uint8)


@settings(max_examples=10, deadline=None)
@given(Hkv=st.sampled_from([1, 2]), G=st.sampled_from([1, 2, 8]), D=st.sampled_from([16, 64]),
       window=st.sampled_from([0, 1, 3, 64, 128]), T=st.integers(1, 6), seed=st.integers(0, 1000),
       split=st.sampled_from([64, SPLIT]), two_phase=st.sampled_from([None, True]))
def test_property_agrees_with_reference(Hkv, G, D, window, T, seed, split, two_phase):
    S = 160
    q, k, v, sinks = setup(Hq=Hkv * G, Hkv=Hkv, D=D, S=S, slots=2, seed=seed)
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, S, (T,), generator=g).to(DEVICE)
    slots = torch.randint(0, 2, (T,), generator=g).to(DEVICE)
    out, ref = both(q[:T], k, v, slots, pos, sinks, window, 1 / math.sqrt(D), _split=split, _two_phase=two_phase)
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
        alone = attention_triton(q[i:i + 1], k, v, slots[:1], pos[i:i + 1], sinks, 128, 0.125)
        assert bits(alone).equal(bits(out[i:i + 1])), PROMPT_LENGTHS[i]


@pytest.mark.filterwarnings("ignore:invalid value encountered")
@pytest.mark.parametrize("last, launch", [(255, {}), (319, {"_split": 128, "_two_phase": True})],
                         ids=["one-split", "split-k"])
def test_the_empty_tile_bug_is_caught(last, launch):
    """Putting the seed bug back (m_use = m_new) must turn the check above red, also split-K.
    (With 128-key splits the empty tile of 191 and 319, tiles 0 and 2, opens their first split;
    that of 255, tile 1, lies in the split before its window and is not walked.)"""
    S = 320
    q, k, v, sinks = setup(Hq=2, Hkv=1, D=16, S=S, seed=2)
    pos = ints(150, 190, 191, last)              # p = 63 mod 64, p >= 191: an empty first tile
    out, ref = both(q[:4], k, v, zeros(4), pos, sinks, 128, _guard=False, **launch)
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
        full = attention_triton(q, k, v, slots, pos, sinks, window, 0.2)
        chunked = torch.cat([attention_triton(q[i:i + 37], k, v, slots[i:i + 37], pos[i:i + 37], sinks, window, 0.2)
                             for i in range(0, T, 37)])
        assert bits(full).equal(bits(chunked))
        for t in (0, 63, 64, 127, 128, 190, 191, 192, 199):
            one = attention_triton(q[t:t + 1], k, v, slots[:1], pos[t:t + 1], sinks, window, 0.2)
            assert bits(one).equal(bits(full[t:t + 1])), (window, t)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_token_blocks_give_one_token_bits(dtype):
    """Several tokens' rows in one program (runs of slots, the union of their splits and tiles, rows
    masked to their own keys) give each row the bits of its token alone: prompts of three slots back
    to back, a window and a split edge inside them, at 3 and 8 tokens a program. Compiled bf16
    this is the tensor-core block against its decode launch (one token a block); elsewhere the
    portable products with _block_t tokens a block against one token a program. The blocks run
    the one-program walk (_two_phase=False: these shapes would pick split-K, which takes one token
    a program); one token alone is launched as the shapes pick, split-K here. Compiled fp32 takes
    the same test-only block of 8 tokens for both (an fp32 dot's bits on a GPU depend on the block's
    row count; fp32 engine launches always take one token a block)."""
    lens = [70, 5, 21]          # splits of 64: the first prompt crosses one; a window of 40 inside it
    q, k, v, sinks = setup(Hq=4, Hkv=1, D=32, S=128, slots=3, seed=3, dtype=dtype)
    slots = torch.cat([torch.full((n,), i) for i, n in enumerate(lens)]).to(DEVICE)
    pos = torch.cat([torch.arange(n) for n in lens]).to(DEVICE)
    q = q[:len(pos)]
    compiled = DEVICE.type == "cuda"
    tc = dtype == torch.bfloat16 and compiled
    # compiled fp32 dots round by the block's row count: there a token alone takes the same block
    alone_kw = dict(_block_t=8) if compiled and not tc else {}
    for window in (0, 40):
        alone = attention_triton(q, k, v, slots, pos, sinks, window, 0.125, _split=64, _tokens=1, **alone_kw)
        for bt in (3, 8):           # 3: blocks straddle the slots' runs; 8: a whole tensor-core block
            kw = dict(_tokens=bt) if tc else dict(_tokens=bt, _block_t=8)
            blocked = attention_triton(q, k, v, slots, pos, sinks, window, 0.125, _split=64,
                                       _two_phase=False, **kw)
            assert bits(blocked).equal(bits(alone)), (window, bt)


def test_a_zero_output_is_plus_zero_in_blocks():
    """DESIGN §8: value columns of -0 (and of negative values that no key shares with a neighbour)
    give exactly-zero outputs; in token blocks they come out +0, whatever the neighbours load."""
    q, k, v, sinks = setup(Hq=4, Hkv=1, D=32, S=128, seed=5)
    v[..., :4] = -0.0
    T = 100
    pos = torch.arange(T, device=DEVICE)
    blocked = attention_triton(q[:T], k, v, zeros(T), pos, sinks, 0, 0.2, _tokens=8, _block_t=8)
    assert (blocked[..., :4] == 0).all() and not torch.signbit(blocked[..., :4]).any()


def test_decode_does_not_see_the_future_cache():
    """Prefill writes the whole prompt before attention; decode has zeros after p. Same bits."""
    q, k, v, sinks = setup(Hq=2, Hkv=1, D=16, S=128, seed=4)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 71:] = 0
    v2[:, :, 71:] = 0
    p = ints(70)
    s = zeros(1)
    for window in (0, 8):
        a = attention_triton(q[:1], k, v, s, p, sinks, window, 0.25)
        b = attention_triton(q[:1], k2, v2, s, p, sinks, window, 0.25)
        assert bits(a).equal(bits(b))


def test_batch_mates_do_not_change_a_row():
    """D2: a token's output alone and inside a batch mixing slots and positions."""
    q, k, v, sinks = setup(Hq=4, Hkv=2, D=32, S=192, slots=3, seed=5)
    pos = ints(5, 130, 64, 191, 0, 77)
    slots = ints(0, 1, 2, 0, 1, 2)
    batch = attention_triton(q[:6], k, v, slots, pos, sinks, 128, 0.17)
    for i in range(6):
        alone = attention_triton(q[i:i + 1], k, v, slots[i:i + 1], pos[i:i + 1], sinks, 128, 0.17)
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


def test_tile_and_split_sizes_are_fixed():
    assert BLOCK_KV == 64
    assert SPLIT == 1024 and SPLIT % BLOCK_KV == 0


# Splits. Tests pass _split=128 (two tiles per split) so that short caches have several; the
# product's SPLIT stays 1024. Positions cross the split boundaries 128 and 256.
SPLIT_TEST = 128
SPLIT_POSITIONS = [0, 63, 64, 127, 128, 129, 191, 200, 255, 256, 300, 319]


@pytest.mark.parametrize("window", [0, 100])
def test_splits_prefill_chunked_and_decode_are_bitwise_equal(window):
    """D3 across splits: the one-program walk (prefill), split-K (decode), chunks of 5 and each
    position alone give the same bits, within the tolerance of the whole-row reference. Window 100
    crosses the split boundaries (positions 128..227 and 256..355 use two splits)."""
    q, k, v, sinks = setup(Hq=2, Hkv=1, D=16, S=320, seed=10)
    pos = ints(*SPLIT_POSITIONS)
    T = len(pos)
    q, slots = q[:T], zeros(T)
    kw = dict(_split=SPLIT_TEST)
    walk, ref = both(q, k, v, slots, pos, sinks, window, 0.25, _two_phase=False, **kw)
    torch.testing.assert_close(walk, ref, rtol=0, atol=ATOL[torch.float32])
    split_k = attention_triton(q, k, v, slots, pos, sinks, window, 0.25, _two_phase=True, **kw)
    assert bits(split_k).equal(bits(walk))
    chunked = torch.cat([attention_triton(q[i:i + 5], k, v, slots[i:i + 5], pos[i:i + 5], sinks, window, 0.25, **kw)
                         for i in range(0, T, 5)])
    assert bits(chunked).equal(bits(walk))
    for i in (3, 4, 8, 9, 11):                      # 127, 128, 255, 256, 319: decode steps
        one = attention_triton(q[i:i + 1], k, v, slots[:1], pos[i:i + 1], sinks, window, 0.25, **kw)
        assert bits(one).equal(bits(walk[i:i + 1])), SPLIT_POSITIONS[i]


def test_one_split_is_the_single_walk():
    """A position whose visible keys lie in one split runs exactly the single 64-key walk: the same
    bits with 128-key splits (split-K) as with one split for the whole cache, and in a cache of
    one split's capacity as in one of three. Position 227 with window 100 starts its window at key
    128: its walk's first tile (keys 64..127, wholly before the window) lies in the split before
    and is not walked, which changes no bit (an empty tile leaves the state exactly empty)."""
    q, k, v, sinks = setup(Hq=2, Hkv=1, D=16, S=320, seed=11)
    for window, positions in ((0, (0, 5, 63, 64, 127)), (100, (127, 227, 240, 255))):
        pos = ints(*positions)
        T = len(pos)
        single = attention_triton(q[:T], k, v, zeros(T), pos, sinks, window, 0.25)           # S <= SPLIT
        split_k = attention_triton(q[:T], k, v, zeros(T), pos, sinks, window, 0.25, _split=SPLIT_TEST,
                                   _two_phase=True)
        assert bits(split_k).equal(bits(single)), window
    small = attention_triton(q[:3], k[:, :, :128].contiguous(), v[:, :, :128].contiguous(), zeros(3), ints(0, 64, 127),
                             sinks, 0, 0.25, _split=SPLIT_TEST)                            # capacity: one split
    assert bits(small).equal(bits(attention_triton(q[:3], k, v, zeros(3), ints(0, 64, 127), sinks, 0, 0.25,
                                                   _split=SPLIT_TEST, _two_phase=True)))


def test_empty_splits_change_nothing():
    """Split-K's grid is the most splits any token can use; a token with fewer (position 5 beside
    position 319: one split of three) walks and stores nothing in the others, so its row equals
    the row alone (D2). A token with no visible key at all (window 4 at position 400 of a 320-key
    cache: the capacity's last split) comes out 0: the sink's weight times no value."""
    q, k, v, sinks = setup(Hq=2, Hkv=1, D=16, S=320, slots=2, seed=12)
    pos, slots = ints(319, 5, 200, 130), ints(0, 1, 1, 0)
    for window in (0, 100):
        batch = attention_triton(q[:4], k, v, slots, pos, sinks, window, 0.25, _split=SPLIT_TEST, _two_phase=True)
        for i in range(4):
            alone = attention_triton(q[i:i + 1], k, v, slots[i:i + 1], pos[i:i + 1], sinks, window, 0.25,
                                     _split=SPLIT_TEST, _two_phase=True)
            assert bits(alone).equal(bits(batch[i:i + 1])), (window, i)
    for two_phase in (False, True):                 # 400 is past the capacity: its split is the last
        out, ref = both(q[:2], k, v, zeros(2), ints(400, 3), sinks, 4, 0.25, _split=SPLIT_TEST, _two_phase=two_phase)
        assert out[0].eq(0).all() and torch.isfinite(out).all()
        torch.testing.assert_close(out, ref, rtol=0, atol=2e-5)


class _Launches:
    """A spy in place of a kernel: counts its launches, then launches it."""

    def __init__(self, kernel):
        self.kernel, self.count = kernel, 0

    def __getitem__(self, grid):
        self.count += 1
        return self.kernel[grid]


@pytest.mark.parametrize("spec_id, split_k", [("kernels/attention-splits-window-961", True),
                                              ("kernels/attention-splits-window-128", False)])
def test_window_spec_takes_the_split_k_launch_at_the_default_split(monkeypatch, spec_id, split_k):
    """The window spec added for split-K decodes the batch and a query alone through split-K at the
    default SPLIT; the older window-128 spec (a 3-tile walk) never leaves the one-program walk."""
    from pathlib import Path

    import lockstep.kernels.attention
    from lockstep.harness.kinds.kernel import kernel_inputs
    from lockstep.harness.specfile import load_spec_file
    root = Path(__file__).resolve().parents[2] / "specs"
    spec = load_spec_file(root / (spec_id + ".yaml"), root)
    t = kernel_inputs(spec, DEVICE)
    kc, vc = t["k"].transpose(0, 1)[None], t["v"].transpose(0, 1)[None]
    spy = _Launches(lockstep.kernels.attention._attention_split_kernel)
    monkeypatch.setattr(lockstep.kernels.attention, "_attention_split_kernel", spy)
    T = t["q"].shape[0]
    for r in (slice(None), slice(T - 1, T)):               # the batch, and a query alone (a decode step)
        before = spy.count
        attention_triton(t["q"][r], kc, vc, zeros(T)[r], t["positions"][r], t["sinks"], t["window"], t["scale"])
        assert spy.count - before == int(split_k), r


def test_split_grid_and_bad_split():
    assert split_grid(320, 0, 128) == 3 and split_grid(320, 100, 128) == 2 and split_grid(320, 1, 128) == 2
    assert split_grid(128, 0, 128) == 1 and split_grid(131072, 128) == 2 and split_grid(131072, 0) == 128
    q, k, v, sinks = setup(Hq=2, Hkv=1, D=16, S=64, seed=13)
    for bad in (0, 100, -64, True, 64.0):
        with pytest.raises(ValueError, match="_split must be a positive multiple of 64"):
            attention_triton(q[:1], k, v, zeros(1), ints(0), sinks, 0, 0.25, _split=bad)
    with pytest.raises(ValueError, match="_tokens=4 is more than the 2 tokens of a row block"):
        attention_triton(q[:8], k, v, zeros(8), torch.arange(8, device=DEVICE), sinks, 0, 0.25,
                         _two_phase=False, _tokens=4, _block_t=2)
