"""The engine's seams, each contract beside a planted fault that turns it red: the captured
round's verify capture list in the eager round's order, the prefix cache's chain key unambiguous
between token ids, top-p's cut on the fixed-order prefix sum, and -0.0 kept bit for bit through
the vocab-parallel embedding. (The forked rank's environment: tests/parallel/test_launch_environment.py.)"""

from __future__ import annotations

import types

import pytest
import torch

from lockstep.engine import graphs, parallel, prefix_cache, sampling
from lockstep.kernels import portable
from tests.engine.test_prefix_cache_blocks import prefilled, kv_cache
from tests.planted import module_with


def red(pin, *args) -> None:
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        pin(*args)


# ---------------------------------------------------------------- the round's verify capture list
class _Target:
    """What RoundGraphs reads of a target; forward records the capture list it was asked for."""
    trace, device = None, torch.device("cpu")

    def __init__(self):
        from lockstep.engine.model import ONE_DEVICE
        self.comm, self.asked = ONE_DEVICE, []

    def new_cache(self, slots, capacity):
        return types.SimpleNamespace(k_all=torch.zeros(1), v_all=torch.zeros(1))

    def forward(self, tokens, positions, slots, cache, capture=()):
        self.asked.append(tuple(capture))
        return tokens.to(torch.float32)


class _Draft:
    boundaries = [5, 1, 3]                  # not sorted: the order is the draft's aux order
    cached = False

    def new_kv(self, slots, capacity, scratch):
        return types.SimpleNamespace(k=torch.zeros(1), v=torch.zeros(1))

    def forward(self, *a, **k):
        raise AssertionError("not called here")


def pin_verify_capture_order(graphs_mod) -> None:
    """The verify forward of a round (through its graph, and eagerly) asks for the draft's
    boundaries in the draft's order: what the eager prefill asks for (engine/speculative.py)."""
    x = torch.arange(3)
    for enabled in (True, False):
        target = _Target()
        rg = graphs_mod.RoundGraphs(target, _Draft(), 2, 2, 8, 4, graphs=enabled)
        for _ in range(3):                  # eager first call, then the graph's (captured on a GPU)
            rg.verify(x, x, x)
        assert target.asked == [(5, 1, 3)] * 3, (enabled, target.asked)


def test_verify_capture_order():
    pin_verify_capture_order(graphs)


@pytest.mark.parametrize("plant", [
    {"self.capture = tuple(draft.boundaries)": "self.capture = tuple(sorted(draft.boundaries))"},
    {"    capture = tuple(capture)\n    return StaticGraph": "    capture = tuple(sorted(capture))\n    return StaticGraph"},
], ids=["round", "forward-graph"])
def test_verify_capture_order_planted(tmp_path, plant):
    red(pin_verify_capture_order, module_with(graphs, plant, tmp_path))


# ---------------------------------------------------------------- the prefix cache's chain key
def pin_chain_key(PrefixCache, chain) -> None:
    """Token ids are separated in the chain key: [1, 23] and [12, 3] are two prefixes, two keys,
    and neither's KV is reused for the other."""
    assert chain("", [1, 23]) != chain("", [12, 3])
    assert chain("", [1, 2, 3]) != chain("", [12, 3]) != chain("", [123])
    cache = PrefixCache(block=2)
    a, b = [1, 23, 7, 8, 9], [12, 3, 7, 8, 9]
    cache.store(a, prefilled(kv_cache(), 0, a, 1), 0)
    cache.store(b, prefilled(kv_cache(), 0, b, 2), 0)
    for prompt, tag in ((a, 1), (b, 2)):
        kv = kv_cache()
        n = cache.lookup(prompt, kv, 1)
        assert n == 4, (prompt, n)                          # two whole blocks, the last token never
        assert {int(kv.k[0][1, 0, p, 0]) // 1000 for p in range(n)} == {tag}, (prompt, "another prompt's KV")


def test_chain_key():
    pin_chain_key(prefix_cache.PrefixCache, prefix_cache._chain)


def test_chain_key_planted(tmp_path):
    planted = module_with(prefix_cache, {'",".join(map(str, tokens))': '"".join(map(str, tokens))'}, tmp_path)
    red(pin_chain_key, planted.PrefixCache, planted._chain)


# ---------------------------------------------------------------- top-p's cut: the fixed-order prefix sum
def cut_case():
    """(z, top_p) where the sorted probabilities' Hillis-Steele prefix sum (portable.prefix_sum) and
    torch.cumsum's sequential one differ at a prefix, and top_p is the larger of the two there: the
    two sums keep different ranks. Found by a seeded search, checked to discriminate."""
    for seed in range(1000):
        z = torch.randn(16, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2
        sp, _ = torch.sort(portable.softmax(z, dim=-1), descending=True, stable=True)
        a, b = portable.prefix_sum(sp, dim=-1), torch.cumsum(sp, dim=-1)
        for k in range(15):
            if a[k] != b[k]:
                return z, max(float(a[k]), float(b[k]))
    raise AssertionError("no prefix where the two sums differ")


def expected_keep(z, top_p, prefix):
    probs = portable.softmax(z, dim=-1)
    sp, order = torch.sort(probs, descending=True, stable=True)
    exclusive = torch.cat([sp.new_zeros(1), prefix(sp)[:-1]])
    keep = torch.empty_like(exclusive, dtype=torch.bool)
    keep[order] = exclusive < top_p
    return keep


def pin_top_p_cut(keep_mask, keep_mask_rows) -> None:
    """keep rank r iff the prefix sum (portable.prefix_sum's order) before it is < top_p (keep_mask's docstring)."""
    z, top_p = cut_case()
    want = expected_keep(z, top_p, lambda s: portable.prefix_sum(s, dim=-1))
    assert not torch.equal(want, expected_keep(z, top_p, lambda s: torch.cumsum(s, dim=-1)))   # the case bites
    assert torch.equal(keep_mask(z, 0, top_p, 0.0), want)
    rows = torch.stack([z, z])
    top = torch.tensor([[top_p, 0.5], [0.0, 1.0]], dtype=torch.float64)          # row 1: top-p off
    got = keep_mask_rows(rows, None, top, None)
    assert torch.equal(got[0], want) and got[1].all()


def test_top_p_cut():
    pin_top_p_cut(sampling.keep_mask, sampling.keep_mask_rows)


@pytest.mark.parametrize("plant", [                 # keep_mask is keep_mask_rows on a batch of one
    {"portable.prefix_sum(sorted_p, dim=-1)[:, :-1]": "torch.cumsum(sorted_p, dim=-1)[:, :-1]"},
], ids=["keep_mask_rows"])
def test_top_p_cut_planted(tmp_path, plant):
    planted = module_with(sampling, plant, tmp_path)
    red(pin_top_p_cut, planted.keep_mask, planted.keep_mask_rows)


# ---------------------------------------------------------------- -0.0 through the vocab-parallel embedding
class _Rank:
    """A ParallelContext of rank `r` of TP 2 whose all-gather returns every rank's tensor for the
    same call: `local(rank)` gives what that rank contributes."""

    def __init__(self, r, local):
        self.tp, self.tp_rank, self.local = 2, r, local

    def gather_tp(self, t):
        return torch.stack([t if q == self.tp_rank else self.local(q) for q in range(self.tp)])


def pin_embedding_keeps_negative_zero(RankCollectives) -> None:
    """Each token's row comes from its owner's shard bit for bit: -0.0, NaN payloads and
    infinities included (data movement, no sum)."""
    V, H = 8, 4
    table = torch.randn(V, H, generator=torch.Generator().manual_seed(3))
    table[1] = torch.tensor([-0.0, -0.0, 0.0, -0.0])
    table[6] = torch.tensor([-0.0, float("inf"), float("-inf"), -0.0])
    table[6, 3] = torch.tensor(0x7FC00123, dtype=torch.int32).view(torch.float32)
    tokens = torch.tensor([1, 6, 0, 7, 6, 1])
    shards = [table[:4].clone(), table[4:].clone()]

    def local(q):
        return _local_rows(RankCollectives, q, shards, tokens)

    want = table.index_select(0, tokens).view(torch.int32)
    for r in range(2):
        got = RankCollectives(_Rank(r, local), 4).embed(shards[r], tokens)
        assert torch.equal(got.view(torch.int32), want), r


def _local_rows(RankCollectives, q, shards, tokens):
    """What rank q puts into the all-gather: its embed with a gather that returns only its own part."""
    seen = {}

    class Own(_Rank):
        def gather_tp(self, t):
            seen["t"] = t
            return torch.stack([t, t])

    RankCollectives(Own(q, None), 4).embed(shards[q], tokens)
    return seen["t"]


def test_embedding_keeps_negative_zero():
    pin_embedding_keeps_negative_zero(parallel.RankCollectives)


def test_embedding_keeps_negative_zero_planted(tmp_path):
    """A masked sum over the ranks (zeros where not owned) turns -0.0 + 0.0 into +0.0."""
    planted = module_with(parallel, {
        "        mine = table.index_select(0, (tokens - self.vocab_lo).clamp(0, n - 1))   # [T, H], valid where owned\n":
        "        mine = table.index_select(0, (tokens - self.vocab_lo).clamp(0, n - 1))   # [T, H], valid where owned\n"
        "        owned = ((tokens >= self.vocab_lo) & (tokens < self.vocab_lo + n))[:, None]\n"
        "        mine = torch.where(owned, mine, torch.zeros_like(mine))\n",
        "        return every[tokens // n, torch.arange(tokens.shape[0], device=tokens.device)]":
        "        return every.sum(0)"}, tmp_path)
    red(pin_embedding_keeps_negative_zero, planted.RankCollectives)
