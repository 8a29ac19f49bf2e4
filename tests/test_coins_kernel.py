"""The coin kernels against an independent byte-level MurmurHash3 and DESIGN §5."""

import struct

import pytest
import torch
from hypothesis import given, settings, strategies as st

from lockstep.kernels.coins import (COIN_MAX, SAMPLE_COLUMNS, coins_from_hash, gumbel_from_hash, murmur_hash32_torch,
                           murmur_hash32_triton, verify_coins)
from tests.kernels.conftest import DEVICE  # the device the kernels are tested on (LOCKSTEP_TEST_DEVICE)
from tests.murmur3_reference import lockstep_key_hash

I64 = st.integers(-(2**63), 2**63 - 1)
KNOWN = [((0, 0, 0), 2167721464), ((1, 7, 1), 4196701286), ((42, 123, 2), 2740678348),
         ((0x123456789ABCDEF0, 456, 17), 3372550890), ((7847, 12345, 1208), 0xFFFFFFFF),
         ((6469398791980356130, 7371, 248146), 0xFFFFFFFF), ((-1, 0, 0), 1040203207)]
MURMUR = {"torch": murmur_hash32_torch, "triton": murmur_hash32_triton}
BACKENDS = list(MURMUR)


def t(values):
    return torch.tensor(values, dtype=torch.int64, device=DEVICE)


def test_reference_implementation_matches_design_known_answers():
    for (s, p, c), h in KNOWN:
        assert lockstep_key_hash(s, p, c) == h


@pytest.mark.parametrize("backend", BACKENDS)
def test_known_answers(backend):
    for (s, p, c), h in KNOWN:
        assert MURMUR[backend](t([s]), t([p]), t([c])).item() == h


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(st.tuples(I64, I64), min_size=1, max_size=6), cols=st.lists(I64, min_size=1, max_size=6))
def test_both_backends_match_independent_murmur3(rows, cols):
    seeds, pos = t([r[0] for r in rows]), t([r[1] for r in rows])
    want = t([[lockstep_key_hash(s, p, c) for c in cols] for s, p in rows])
    for backend in BACKENDS:
        got = MURMUR[backend](seeds, pos, t(cols))
        assert got.dtype == torch.int64 and got.shape == (len(rows), len(cols))
        assert torch.equal(got, want), backend


@pytest.mark.parametrize("n,m", [(1, 1), (15, 63), (16, 64), (17, 65), (33, 129), (1, 2881)])
def test_triton_tails_equal_torch(n, m):
    # The kernel tiles 16 x 64; shapes one past a tile must be neither dropped nor garbage.
    seeds, pos = torch.arange(n, device=DEVICE) * 7919 - 3, torch.arange(n, device=DEVICE) + 2**32 - 5
    cols = torch.arange(m, device=DEVICE) * 31
    assert torch.equal(murmur_hash32_triton(seeds, pos, cols), murmur_hash32_torch(seeds, pos, cols))


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_inputs(backend):
    assert MURMUR[backend](t([]), t([]), t([1, 2])).shape == (0, 2)
    assert MURMUR[backend](t([1]), t([2]), t([])).shape == (1, 0)


def test_non_contiguous_inputs():
    seeds = torch.arange(20, device=DEVICE)[::2]
    pos = torch.arange(30, device=DEVICE)[::3]
    cols = torch.arange(8, device=DEVICE)[::2]
    assert torch.equal(murmur_hash32_triton(seeds, pos, cols), murmur_hash32_torch(seeds.clone(), pos.clone(), cols.clone()))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [torch.tensor([1.0]), torch.tensor([1], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int64), [1]])
def test_bad_key_types_are_rejected(bad, backend):
    with pytest.raises(ValueError, match="1-D int64"):
        MURMUR[backend](bad, t([0]), t([0]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_mismatched_lengths(backend):
    with pytest.raises(ValueError, match="same length"):
        MURMUR[backend](t([1, 2]), t([0]), t([0]))


def _f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


@pytest.mark.parametrize("h", [0, 1, 2**31, 2**32 - 131, 2**32 - 130, 2**32 - 129, 2**32 - 2, 2**32 - 1])
def test_coin_conversion_and_clamp(h):
    coin = coins_from_hash(t([h])).item()  # float64 division and float32 cast: IEEE on every device
    want = min(_f32(h / 4294967295), 1 - 2**-24)
    assert coin == want and 0.0 <= coin < 1.0
    # the 129 top hashes are exactly those whose unclamped float32 coin is 1.0
    assert (_f32(h / 4294967295) == 1.0) == (h >= 2**32 - 129)


def test_exactly_129_hashes_round_to_one():
    top = torch.arange(2**32 - 1000, 2**32, dtype=torch.int64)
    unclamped = (top.double() / 4294967295).float()
    assert int((unclamped == 1.0).sum()) == 129
    assert torch.all(coins_from_hash(top) <= COIN_MAX)


@pytest.mark.parametrize("backend", BACKENDS)
def test_verify_coins_columns(backend):
    seeds, lens = t([3, -9, 3]), t([10, 2**33 + 1, 10])
    coins, final = verify_coins(seeds, lens, 5, MURMUR[backend])
    assert coins.shape == (3, 5) and final.shape == (3,) and coins.dtype == final.dtype == torch.float32
    for i in range(3):
        hashes = [lockstep_key_hash(int(seeds[i]), int(lens[i]), c) for c in range(6)]
        assert coins[i].tolist() == [min(_f32(h / 4294967295), 1 - 2**-24) for h in hashes[:5]]
        assert final[i].item() == min(_f32(hashes[5] / 4294967295), 1 - 2**-24)
    assert torch.equal(coins[0], coins[2])


@pytest.mark.parametrize("n", [0, -1, 1.5, True])
def test_verify_coins_rejects_bad_draft_token_num(n):
    with pytest.raises(ValueError, match="draft_token_num"):
        verify_coins(t([1]), t([1]), n)


def test_gumbel_noise_is_finite_at_both_ends_and_monotonic():
    h = t([0, 1, 2**31, 2**32 - 2, 2**32 - 1]).cpu()
    g = gumbel_from_hash(h)
    assert g.dtype == torch.float64 and torch.isfinite(g).all()
    assert torch.all(g[1:] >= g[:-1])
    assert g[0].item() == -torch.log(torch.tensor(torch.finfo(torch.float64).max, dtype=torch.float64)).item()
    assert g[-1].item() == -torch.log(torch.tensor(2.0**-32, dtype=torch.float64)).item()


def test_streams_use_disjoint_columns():
    # The sampling stream at vocab id v must never reuse verify coin column v.
    seeds, pos = t([5]), t([100])
    verify = murmur_hash32_torch(seeds, pos, torch.arange(16, device=DEVICE))
    sample = murmur_hash32_torch(seeds, pos, torch.arange(16, device=DEVICE) + SAMPLE_COLUMNS)
    assert not torch.any(verify == sample)
