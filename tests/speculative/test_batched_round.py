"""The batched speculative round (engine.spec_round._round) against node-by-node re-implementations
of DESIGN §6 (the tests' oracles), and its host-read budget: no scalar read anywhere in a round but the one _read_round."""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import lockstep.engine.speculative as spec_mod
from lockstep.engine import spec_accept, spec_round, spec_tree
from lockstep.engine.generate import Request
from lockstep.engine.sampling import TORCH_SAMPLER, SamplingParams, chosen_logprob
from lockstep.engine.speculative import (SpecParams, Tree, inverse_cdf, inverse_cdf_rows, speculative_generate,
                                verify_greedy, verify_rejection, verify_target_only)

from tests.speculative.conftest import training_prompts
from tests.speculative.test_verify_specs import target_only
from tests.speculative.verify_bugs import rejection

V = 11


def random_tree(rng: random.Random, n: int, k: int, depth: int) -> Tree:
    """A tree of n nodes, at most k children per node, at most `depth` deep (raised until n fit),
    distinct sibling tokens."""
    while sum(k ** d for d in range(1, depth + 1)) < n - 1:
        depth += 1
    parents, depths, kids = [-1], [0], {0: 0}
    while len(parents) < n:
        p = rng.choice([i for i in range(len(parents)) if kids[i] < k and depths[i] < depth])
        parents.append(p)
        depths.append(depths[p] + 1)
        kids[p] += 1
        kids[len(parents) - 1] = 0
    tokens = [rng.randrange(V)]
    for i in range(1, n):
        used = {tokens[c] for c in range(1, i) if parents[c] == parents[i]}
        tokens.append(rng.choice([t for t in range(V) if t not in used]))
    return Tree(tokens, parents)


def batched(trees, mode, argmax=None, p=None, q=None, coins=None, fin=None, ts=1.0, ta=1.0):
    """The round's acceptance (step 3 of _round) on host-made trees, all in one batch ->
    [(accepted nodes, token)]."""
    R, N = len(trees), len(trees[0].tokens)
    K, W = max(len(t.children(i)) for t in trees for i in range(N)), N
    tokens = torch.tensor([t.tokens for t in trees])
    lay = spec_tree._layout(torch.tensor([t.parents for t in trees]), N - 1, W, max(K, 1))
    if mode == "greedy":
        choice = spec_accept._accept_greedy(tokens, lay.children, argmax)
    elif mode == "target-only":
        choice = spec_accept._accept_target_only(tokens, lay.children, p, coins, ts, ta)
    else:
        choice = spec_accept._accept_rejection(tokens, lay.children, p, q, coins)
    nodes, count = spec_accept._walk(choice, W)
    last = nodes[:, -1]
    if mode == "greedy":
        final = argmax.gather(1, last[:, None])[:, 0].tolist()
    else:
        weights = spec_accept._final_draw_weights(p, tokens, lay.children, last, q if mode == "rejection" else None)
        final = inverse_cdf_rows(weights, fin)
    return [(nodes[a, :count[a]].tolist(), final[a]) for a in range(R)]


def by_hand_greedy(tree, argmax):
    """DESIGN §6 greedy, written node by node (an oracle independent of the batched code)."""
    cur, accepted = 0, [0]
    while (nxt := next((c for c in tree.children(cur) if tree.tokens[c] == argmax[cur]), None)) is not None:
        cur = nxt
        accepted.append(cur)
    return accepted, int(argmax[cur])


@pytest.mark.parametrize("mode", ["greedy", "target-only", "rejection"])
def test_batched_acceptance_equals_the_rules_by_hand_and_a_batch_of_one(mode):
    """A batch of four trees decides each tree as the node-by-node rules of DESIGN §6 do (the
    tests' own re-implementations) and as the same code on a batch of one (verify_*, what the
    verify specs run): a request's outcome does not depend on its batchmates."""
    by_hand = {"greedy": by_hand_greedy, "target-only": target_only(), "rejection": rejection()}[mode]
    one = {"greedy": verify_greedy, "target-only": verify_target_only, "rejection": verify_rejection}[mode]
    rng = random.Random(7)
    g = torch.Generator().manual_seed(7)
    for trial in range(30):
        N = rng.randrange(2, 8)
        k, depth = (1, N - 1) if mode == "rejection" else (rng.randrange(1, 4), rng.randrange(1, N))
        trees = [random_tree(rng, N, k, depth) for _ in range(4)]
        p = torch.softmax(torch.randn(4, N, V, generator=g, dtype=torch.float64) * 2, -1)
        p[0, :, :3] = 0                                              # zero-probability ids
        p = p / p.sum(-1, keepdim=True)
        q = torch.softmax(torch.randn(4, N, V, generator=g, dtype=torch.float64), -1)
        coins = torch.rand(4, N, generator=g)
        fin = torch.rand(4, generator=g)
        argmax = torch.where(torch.rand(4, N, generator=g) < 0.6,      # mostly a child's token: accepts
                             torch.tensor([[t.tokens[min(i + 1, N - 1)] for i in range(N)] for t in trees]),
                             torch.randint(0, V, (4, N), generator=g))
        for t, a in zip(trees, range(4)):
            t.q = [None] + [q[a, i] for i in range(1, N)]
        ts, ta = (0.6, 0.7) if trial % 2 else (1.0, 1.0)
        got = batched(trees, mode, argmax, p, q, coins, fin, ts, ta)
        for a, t in enumerate(trees):
            if mode == "greedy":
                args = (t, argmax[a].tolist())
            elif mode == "target-only":
                args = (t, p[a], coins[a], float(fin[a]), ts, ta)
            else:
                args = (t, p[a], coins[a], float(fin[a]))
            assert got[a] == tuple(by_hand(*args)) == tuple(one(*args)), (mode, trial, a, t)


def test_layout_paths_are_the_tree_paths():
    rng = random.Random(3)
    for _ in range(20):
        N = rng.randrange(2, 9)
        trees = [random_tree(rng, N, 3, rng.randrange(1, N)) for _ in range(3)]
        lay = spec_tree._layout(torch.tensor([t.parents for t in trees]), N - 1, N, 3)
        for a, t in enumerate(trees):
            paths = [[n for n, ok in zip(lay.path_nodes[a, j].tolist(), lay.valid[a, j].tolist()) if ok]
                     for j in range(N - 1)]
            assert [x for x in paths if x] == t.paths()
            for node in range(N):            # a node's row: in the first path holding it, at its depth
                j = next(j for j, path in enumerate(t.paths()) if node in path)
                assert lay.node_row[a, node] == (a * (N - 1) + j) * N + t.depth(node)


def test_inverse_cdf_rows_and_logprobs_match_the_row_functions():
    g = torch.Generator().manual_seed(1)
    w = torch.rand(6, 500, generator=g, dtype=torch.float64) ** 4
    w[2, 100:] = 0
    w[3, :499] = 0
    coins = torch.rand(6, generator=g)
    assert inverse_cdf_rows(w, coins) == [inverse_cdf(w[i], float(coins[i])) for i in range(6)]
    with pytest.raises(ValueError, match="coins must be in"):
        inverse_cdf_rows(w[:1], torch.tensor([1.0]))
    logits = torch.randn(5, 300, generator=g) * 4
    toks = torch.randint(0, 300, (5,), generator=g)
    got = TORCH_SAMPLER.chosen_logprobs(logits, toks)
    assert all(got[i].view(torch.int32) == chosen_logprob(logits[i], int(toks[i])).view(torch.int32)
               for i in range(5))


# --------------------------------------------------------------------------- host reads
SYNCING = {"_local_scalar_dense", "nonzero", "masked_select", "unique_dim", "_unique2", "repeat_interleave",
           "bincount", "item"}


class CountReads(TorchDispatchMode):
    """Counts the ops that read a value back to the host (or sync on it, on a GPU): scalar reads
    (.item(), int(), float(), bool()), and the ops whose output size depends on the data."""

    def __init__(self):
        super().__init__()
        self.on, self.reads = False, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        kwargs = kwargs or {}
        if name == "repeat_interleave" and (func._overloadname == "self_int" or kwargs.get("output_size") is not None):
            pass                                      # a constant repeat count: the size is known
        elif self.on and (name in SYNCING or (name == "index" and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ())))):
            self.reads.append(f"{name}.{func._overloadname}")
        return func(*args, **kwargs)


def reads_per_round(monkeypatch, target, draft, reqs, sp):
    mode = CountReads()
    per_round, tolist = [], []
    real_round, real_read, real_tolist = spec_mod._round, spec_round._read_round, torch.Tensor.tolist

    def counted_tolist(t):
        if mode.on:
            tolist.append(tuple(t.shape))
        return real_tolist(t)

    def round_spy(*a, **k):
        mode.on, mode.reads, tolist[:] = True, [], []
        real_round(*a, **k)
        mode.on = False
        per_round.append((list(mode.reads), list(tolist), reads[0]))
        reads[0] = 0

    def read_spy(*a, **k):                     # the one read: its own host work is not counted
        reads[0] += 1
        mode.on = False
        try:
            return real_read(*a, **k)
        finally:
            mode.on = True

    reads = [0]
    monkeypatch.setattr(spec_mod, "_round", round_spy)
    monkeypatch.setattr(spec_round, "_read_round", read_spy)
    monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)
    with mode:
        speculative_generate(target, draft, reqs, sp)
    return per_round


@pytest.mark.parametrize("sp", [SpecParams(num_steps=3, topk=1, draft_token_num=4, verify="greedy"),
                                SpecParams(num_steps=3, topk=2, draft_token_num=6),
                                SpecParams(verify="rejection")], ids=["chain", "tree-target-only", "rejection"])
@pytest.mark.parametrize("pair", ["fitted", "fitted_bf16"])
def test_a_round_reads_the_host_once_whatever_the_batch(pair, monkeypatch, sp, request):
    target, draft = request.getfixturevalue(pair)
    P = training_prompts(3)
    params = [SamplingParams(greedy=True, max_new_tokens=6)] if sp.verify == "greedy" else \
        [SamplingParams(temperature=0.7, max_new_tokens=6), SamplingParams(greedy=True, max_new_tokens=6)]
    for n in (1, 3):
        reqs = [Request(P[i], params[i % len(params)], seed=i) for i in range(n)]
        rounds = reads_per_round(monkeypatch, target, draft, reqs, sp)
        assert rounds, "no round ran"
        for reads, tolists, n_read in rounds:
            assert n_read == 1, (n, n_read)                   # exactly one _read_round per round
            assert reads == [] and tolists == [], (n, reads, tolists)   # and no other read


def test_the_count_sees_a_planted_read(fitted, monkeypatch):
    """The counter is not blind: one int() of a device value inside the round shows up."""
    target, draft = fitted
    real = spec_accept._walk

    def walk_and_peek(choice, W):
        nodes, count = real(choice, W)
        int(count[0])
        return nodes, count

    monkeypatch.setattr(spec_accept, "_walk", walk_and_peek)
    req = Request(training_prompts(1)[0], SamplingParams(greedy=True, max_new_tokens=4))
    rounds = reads_per_round(monkeypatch, target, draft, [req], SpecParams(verify="greedy"))
    assert rounds and all(reads == ["_local_scalar_dense.default"] for reads, _, _ in rounds), rounds
