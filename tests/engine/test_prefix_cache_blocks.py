"""PrefixCache's bookkeeping without a model: which positions a lookup reuses, from which stored
block, into which slot, and what it counts. (tests/replay/test_prefix_cache.py shows a hit equals
a cold prefill bit for bit through generate(); these pin the block chain itself, fast enough for
mutation testing: see docs/contributing.md.)

The KV here is two layers of [slots, 1 head, 64 positions, 2] buffers in which every stored
position holds a value naming the prompt it came from, so a test can tell whose KV was copied."""

from __future__ import annotations

import types

import pytest
import torch

from lockstep.engine.prefix_cache import PrefixCache

LAYERS, SLOTS, CAPACITY = 2, 4, 64


def kv_cache():
    return types.SimpleNamespace(k=[torch.zeros(SLOTS, 1, CAPACITY, 2) for _ in range(LAYERS)],
                                 v=[torch.zeros(SLOTS, 1, CAPACITY, 2) for _ in range(LAYERS)])


def prefilled(kv, slot, prompt, tag):
    """Write what a prefill of `prompt` would leave in `slot`: k = tag*1000 + layer*100 + position
    (v the same, negated), so every copied value says which prompt, layer and position it is."""
    for layer in range(LAYERS):
        for p in range(len(prompt)):
            kv.k[layer][slot, :, p] = tag * 1000 + layer * 100 + p
            kv.v[layer][slot, :, p] = -(tag * 1000 + layer * 100 + p)
    return kv


def stored(cache, prompt, tag, slot=0):
    kv = prefilled(kv_cache(), slot, prompt, tag)
    cache.store(prompt, kv, slot)


def reused(cache, prompt, slot=2):
    """-> (n, [(tag, position) of each reused position], whether everything after n is untouched)."""
    kv = kv_cache()
    n = cache.lookup(prompt, kv, slot)
    origin = []
    for p in range(n):
        values = {float(kv.k[layer][slot, 0, p, d]) - layer * 100 for layer in range(LAYERS) for d in range(2)}
        negs = {-float(kv.v[layer][slot, 0, p, d]) - layer * 100 for layer in range(LAYERS) for d in range(2)}
        assert len(values) == 1 and values == negs, f"position {p}: layers, k and v disagree: {values} {negs}"
        tag, pos = divmod(int(values.pop()), 1000)
        origin.append((tag, pos))
    rest_clean = all(not buf[slot, :, n:].any() for buf in kv.k + kv.v)
    others_clean = all(not buf[s].any() for buf in kv.k + kv.v for s in range(SLOTS) if s != slot)
    assert others_clean, "a lookup wrote outside its slot"
    return n, origin, rest_clean


A = list(range(100, 140))     # 40 tokens: blocks of 16 -> [0, 16), [16, 32), [32, 40)


def test_an_empty_cache_misses_and_counts_the_lookup():
    cache = PrefixCache(block=16)
    assert reused(cache, A) == (0, [], True)
    assert (cache.lookups, cache.hits, cache.hit_tokens) == (1, 0, 0)


def test_the_same_prompt_reuses_all_but_its_last_token_from_the_same_positions():
    cache = PrefixCache(block=16)
    stored(cache, A, tag=1)
    n, origin, rest_clean = reused(cache, A)
    assert n == 39, "the last prompt token is always computed (its logits are needed)"
    assert origin == [(1, p) for p in range(39)] and rest_clean
    assert (cache.lookups, cache.hits, cache.hit_tokens) == (1, 1, 39)


def test_a_longer_prompt_walks_the_chain_and_takes_the_short_last_block_whole():
    cache = PrefixCache(block=16)
    stored(cache, A, tag=1)
    n, origin, rest_clean = reused(cache, A + [7, 8, 9])
    assert n == 40 and origin == [(1, p) for p in range(40)] and rest_clean


def test_a_divergence_inside_a_block_reuses_the_agreeing_head_of_that_block():
    cache = PrefixCache(block=16)
    stored(cache, A, tag=1)
    prompt = A[:20] + [1, 2, 3] + A[23:]
    n, origin, rest_clean = reused(cache, prompt)
    assert n == 20 and origin == [(1, p) for p in range(20)] and rest_clean
    prompt = A[:3] + [1] + A[4:]
    assert reused(cache, prompt)[0] == 3, "a block is found only under its whole prefix: the chain stops at 3"


def test_counts_add_up_over_lookups_and_a_miss_is_not_a_hit():
    cache = PrefixCache(block=16)
    stored(cache, A, tag=1)
    reused(cache, A)                 # 39
    reused(cache, [1, 2, 3])         # a miss
    reused(cache, A[:21])            # 20
    assert (cache.lookups, cache.hits, cache.hit_tokens) == (3, 2, 59)


def test_the_sibling_sharing_the_most_tokens_is_the_one_reused():
    """Two stored prompts share a first block and part of the second: the lookup follows the
    one that agrees longer with the new prompt, and copies that one's KV."""
    cache = PrefixCache(block=16)
    x = A[:16] + [1, 2, 3, 4] + A[20:32]
    y = A[:16] + [1, 2, 9, 9] + A[20:32]
    stored(cache, x, tag=1)
    stored(cache, y, tag=2)
    n, origin, _ = reused(cache, A[:16] + [1, 2, 9, 9, 5, 5])
    assert n == 20 and origin == [(1, p) for p in range(16)] + [(2, p) for p in range(16, 20)], origin
    n, origin, _ = reused(cache, A[:16] + [1, 2, 3, 7, 5])
    assert n == 19 and origin[16:] == [(1, 16), (1, 17), (1, 18)], origin


def test_a_prompt_one_block_long_reuses_all_but_its_last_token():
    cache = PrefixCache(block=4)
    stored(cache, [5, 6, 7, 8], tag=3)
    assert reused(cache, [5, 6, 7, 8])[:2] == (3, [(3, 0), (3, 1), (3, 2)])
    assert reused(cache, [5, 6, 7, 8, 9])[:2] == (4, [(3, p) for p in range(4)])
    assert reused(cache, [5])[0] == 0 and cache.hits == 2, "one token: nothing may be reused"


def test_a_prompt_ending_on_a_block_edge_still_leaves_its_last_token():
    """Two full blocks stored, the same two blocks looked up: the second block is taken only up
    to the prompt's last token (a partial hit), never whole."""
    cache = PrefixCache(block=4)
    stored(cache, list(range(8)), tag=5)
    assert reused(cache, list(range(8)))[:2] == (7, [(5, p) for p in range(7)])
    assert reused(cache, list(range(9)))[:2] == (8, [(5, p) for p in range(8)])


def test_storing_again_keeps_one_block_per_prefix():
    cache = PrefixCache(block=4)
    stored(cache, [5, 6, 7, 8, 9], tag=1)
    stored(cache, [5, 6, 7, 8, 9], tag=2)          # the same KV, bit for bit, in a real engine
    assert reused(cache, [5, 6, 7, 8, 9, 10])[:2] == (5, [(1, p) for p in range(5)]), "the first stored is kept"


def test_stored_kv_is_a_copy_not_a_view_of_the_slot():
    cache = PrefixCache(block=4)
    kv = prefilled(kv_cache(), 0, [5, 6, 7, 8], tag=1)
    cache.store([5, 6, 7, 8], kv, 0)
    for buf in kv.k + kv.v:
        buf.zero_()                                   # the slot is reused by the next request
    assert reused(cache, [5, 6, 7, 8])[1] == [(1, 0), (1, 1), (1, 2)]


def test_the_store_reads_the_slot_it_is_given():
    cache = PrefixCache(block=4)
    stored(cache, [5, 6, 7, 8, 9, 10], tag=4, slot=3)
    assert reused(cache, [5, 6, 7, 8, 9, 10], slot=1)[:2] == (5, [(4, p) for p in range(5)])


@pytest.mark.parametrize("block", [0, -1, True, 1.5, "16", None])
def test_a_block_that_is_not_a_positive_int_is_refused(block):
    with pytest.raises(ValueError, match=r"PrefixCache.block: must be an int >= 1, got "):
        PrefixCache(block=block)


def test_a_block_of_one_position_works():
    cache = PrefixCache(block=1)
    stored(cache, [5, 6, 7], tag=1)
    assert reused(cache, [5, 6, 9])[:2] == (2, [(1, 0), (1, 1)])
