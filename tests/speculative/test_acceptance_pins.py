"""The speculative round's acceptance and layout helpers (engine/speculative.py) on cases worked by
hand, each one where a near variant of the code (mutmut's survivors, docs/contributing.md) gives
another answer: a tree of the root alone, a coin exactly at the threshold, a zero-probability
child at coin 0, sums that round differently in float32, ties among more candidates than an
unstable sort keeps in order, batches whose rows must not see each other, the round's step 3
(_accept_step) on a fake run, and the helpers on the "meta" device, where a tensor made on the
default device is refused as on a GPU. No model."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from lockstep.engine import spec_accept, spec_round, spec_tree
from lockstep.engine.request import Request, SamplingParams, seed_as_int64
from lockstep.engine.sampling import TORCH_SAMPLER
from lockstep.engine.speculative import (SpecParams, Tree, TreeBatch, inverse_cdf_rows, target_probs, verify_greedy,
                                verify_rejection, verify_target_only)
from lockstep.kernels.coins import COIN_MAX, verify_coins

from tests.speculative.test_verify_specs import target_only
from tests.speculative.verify_bugs import rejection

TORCH_TARGET = SimpleNamespace(ops=SimpleNamespace(sampler=TORCH_SAMPLER))   # what the round reads of its target

f64 = torch.float64

#        0 (tok 4)
#       /        \
#   1 (tok 3)   2 (tok 1)
#    /     \        \
# 3 (tok 0) 4 (tok 2) 5 (tok 4)
TREE = Tree(tokens=[4, 3, 1, 0, 2, 4], parents=[-1, 0, 0, 1, 1, 2])
ROOT = Tree(tokens=[1], parents=[-1])           # the root alone: nothing drafted (its token: a vocabulary id)


def coins(*values):
    return torch.tensor(values, dtype=torch.float32)


# ---------------------------------------------------------------------- the host tree as a batch of one
def test_one_tree_gives_tokens_children_and_the_deepest_path():
    tokens, children, W = spec_accept._one_tree(TREE)
    assert tokens.tolist() == [[4, 3, 1, 0, 2, 4]]
    assert children.tolist() == [[[1, 2], [3, 4], [5, -1], [-1, -1], [-1, -1], [-1, -1]]]
    assert W == 3                                            # 0 -> 1 -> 3: three nodes
    tokens, children, W = spec_accept._one_tree(Tree([5, 6, 8, 9], [-1, 0, 1, 2]))   # a chain
    assert (tokens.tolist(), children.tolist(), W) == ([[5, 6, 8, 9]], [[[1], [2], [3], [-1]]], 4)
    tokens, children, W = spec_accept._one_tree(ROOT)
    assert (tokens.tolist(), children.tolist(), W) == ([[1]], [[[-1]]], 1)


def test_the_root_alone_is_verified_to_the_bonus_token():
    """Nothing to accept: every mode draws the next token from the root's distribution."""
    assert verify_greedy(ROOT, [5]) == ([0], 5)
    p = torch.tensor([[0.0, 0.25, 0.0, 0.75]], dtype=f64)
    # running sums 0 .25 .25 1: coin .2 -> id 1, coin .5 -> id 3
    assert verify_target_only(ROOT, p, coins(0.9), 0.2) == ([0], 1)
    assert verify_target_only(ROOT, p, coins(0.9), 0.5) == ([0], 3)
    root = Tree([1], [-1], [None])
    assert verify_rejection(root, p, coins(0.9), 0.2) == ([0], 1)
    assert verify_rejection(root, p, coins(0.9), 0.5) == ([0], 3)


def test_verify_rejection_refuses_a_tree_with_the_exact_message():
    with pytest.raises(ValueError, match=r"^verify_rejection: the tree must be a chain \(topk=1\)$"):
        verify_rejection(Tree([4, 3, 1], [-1, 0, 0], [None, None, None]), torch.ones(3, 5, dtype=f64),
                         coins(0, 0, 0), 0.5)


def test_the_final_coin_is_used_in_float64():
    """0.5 - 1e-10 rounds to 0.5 in float32: over [.5, .5] that is id 1 instead of id 0."""
    p = torch.tensor([[0.5, 0.5]], dtype=f64)
    assert verify_target_only(ROOT, p, coins(0.0), 0.5 - 1e-10) == ([0], 0)
    assert verify_target_only(ROOT, p, coins(0.0), 0.5) == ([0], 1)
    assert verify_rejection(Tree([1], [-1], [None]), p, coins(0.0), 0.5 - 1e-10) == ([0], 0)


# ---------------------------------------------------------------------- the verify layout
def test_layout_of_two_trees_in_full():
    """P = 3 paths of W = 4 rows per request. Tree A: 0 -> {1, 2}, 1 -> 3 (leaves 2 and 3: the
    paths [0, 2] and [0, 1, 3]); tree B: the chain 0 -> 1 -> 2 -> 3 (one path). Rows past a leaf
    and paths past the last leaf are padding: node 0, not valid. A node's row is in the first path
    holding it, at its depth: (request * P + path) * W + depth."""
    lay = spec_tree._layout(torch.tensor([[-1, 0, 0, 1], [-1, 0, 1, 2]]), 3, 4, 2)
    T, F = True, False
    assert lay.path_nodes.tolist() == [[[0, 2, 0, 0], [0, 1, 3, 0], [0, 0, 0, 0]],
                                       [[0, 1, 2, 3], [0, 0, 0, 0], [0, 0, 0, 0]]]
    assert lay.valid.tolist() == [[[T, T, F, F], [T, T, T, F], [F, F, F, F]],
                                  [[T, T, T, T], [F, F, F, F], [F, F, F, F]]]
    assert lay.node_path.tolist() == [[0, 1, 0, 1], [0, 0, 0, 0]]
    assert lay.node_row.tolist() == [[0, 5, 1, 6], [12, 13, 14, 15]]
    assert lay.children.tolist() == [[[1, 2], [3, -1], [-1, -1], [-1, -1]], [[1, -1], [2, -1], [3, -1], [-1, -1]]]


# ---------------------------------------------------------------------- target-only's comparisons
def test_target_only_a_zero_probability_child_is_refused_even_at_coin_zero():
    tree = Tree([2, 0, 1], [-1, 0, 0])
    p = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], dtype=f64)
    # child 1 (token 0) has p 0: refused although 0 <= 0; child 2 (token 1): .5 >= 0, accepted
    assert verify_target_only(tree, p, coins(0.0, 0.0, 0.0), 0.5) == ([0, 2], 2)


def test_target_only_accepts_a_coin_equal_to_the_mass():
    tree = Tree([2, 1], [-1, 0])
    p = torch.tensor([[0.5, 0.25, 0.25], [0.0, 0.0, 1.0]], dtype=f64)
    assert verify_target_only(tree, p, coins(0.25, 0.0), 0.0) == ([0, 1], 2)        # .25 <= .25
    # just above: rejected; the correction from p[0] without token 1 = [.5, 0, .25], coin 0 -> id 0
    assert verify_target_only(tree, p, coins(0.2500001, 0.0), 0.0) == ([0], 0)


def test_target_only_running_sum_is_float64_whatever_p_arrives_in():
    """p (float32 here) .5 and 3 * 2^-26: in float32 .5 + 3 * 2^-26 rounds up to .5 + 2^-24, the
    coin; in float64 the sum stays below it, so the second child is rejected too."""
    tokens = torch.tensor([[2, 0, 1]])
    children = spec_tree._children(torch.tensor([[-1, 0, 0]]), 2)
    p = torch.zeros(1, 3, 4, dtype=torch.float32)
    p[0, 0, 0], p[0, 0, 1] = 0.5, 3 * 2.0 ** -26
    u = torch.tensor([[0.5 + 2.0 ** -24, 0.0, 0.0]], dtype=torch.float32)
    assert spec_accept._accept_target_only(tokens, children, p, u, 1.0, 1.0).tolist() == [[-1, -1, -1]]
    u[0, 0] = 0.5                                            # a coin of .5 accepts the first child (p .5)
    assert spec_accept._accept_target_only(tokens, children, p, u, 1.0, 1.0).tolist() == [[1, -1, -1]]


# ---------------------------------------------------------------------- rejection's comparison
def test_rejection_keeps_a_child_only_when_coin_times_q_is_below_p():
    """A chain 0 -> 1 -> 2. Node 1 (token 2): coin .5 * q 0.5 = .25, not below p .25: rejected.
    Node 2 (token 3): .5 * .4 = .2 < .3: kept. Node 2 has no child: -1 (exactly)."""
    tokens = torch.tensor([[4, 2, 3]])
    children = spec_tree._children(torch.tensor([[-1, 0, 1]]), 1)
    p = torch.zeros(1, 3, 5, dtype=f64)
    q = torch.zeros(1, 3, 5, dtype=f64)
    p[0, 0, 2], q[0, 1, 2] = 0.25, 0.5
    p[0, 1, 3], q[0, 2, 3] = 0.3, 0.4
    assert spec_accept._accept_rejection(tokens, children, p, q, coins(0.5, 0.5, 0.5)[None]).tolist() == [[-1, 2, -1]]


# ---------------------------------------------------------------------- drafting's selection and numbering
def by_hand_best(row: list[float], k: int) -> list[int]:
    """The k best by score descending, equal scores to the earlier candidate, in creation order."""
    return sorted(sorted(range(len(row)), key=lambda i: (-row[i], i))[:k])


def test_best_keeps_the_earlier_of_equal_scores_among_many():
    """40 candidates with three or four distinct scores: more than torch's CPU sort keeps in order
    unless asked for a stable sort."""
    scores = torch.tensor([[-float(i % 3) for i in range(40)], [-float(i * 7 % 4) for i in range(40)]], dtype=f64)
    for k in (1, 5, 20, 39):
        assert spec_tree._best(scores, k).tolist() == [by_hand_best(row, k) for row in scores.tolist()], k


def test_number_tree_numbers_the_chosen_candidates_and_their_parents():
    """Candidates (creation order) c0 (root's, -.1), c1 (root's, -.3), c2 (c0's, -.2), c3 (c1's, -.5).
    N = 3 keeps c0 and c2: node 1 = c0 (parent the root), node 2 = c2 (parent node 1)."""
    tokens, parents, order = spec_tree.number_tree(
        torch.tensor([40]), torch.tensor([[11, 12, 13, 14]]), torch.tensor([[-1, -1, 0, 1]]),
        torch.tensor([[-0.1, -0.3, -0.2, -0.5]], dtype=f64), 3)
    assert (tokens.tolist(), parents.tolist(), order.tolist()) == ([[40, 11, 13]], [[-1, 0, 1]], [[0, 2]])
    # N = 4 keeps c0, c1, c2: node 3 = c2 keeps parent node 1 (c0), node 2 = c1 hangs from the root
    tokens, parents, order = spec_tree.number_tree(
        torch.tensor([40]), torch.tensor([[11, 12, 13, 14]]), torch.tensor([[-1, -1, 0, 1]]),
        torch.tensor([[-0.1, -0.3, -0.2, -0.5]], dtype=f64), 4)
    assert (tokens.tolist(), parents.tolist(), order.tolist()) == ([[40, 11, 12, 13]], [[-1, 0, 0, 1]], [[0, 1, 2]])


def test_number_tree_with_more_requests_than_candidates():
    """Three requests of two candidates each (a chain of two): each its own tree."""
    tokens, parents, order = spec_tree.number_tree(
        torch.tensor([30, 31, 32]), torch.tensor([[1, 2], [3, 4], [5, 6]]),
        torch.tensor([[-1, 0], [-1, -1], [-1, 0]]),
        torch.tensor([[-0.5, -0.7], [-0.9, -0.1], [-0.2, -0.2]], dtype=f64), 3)
    assert tokens.tolist() == [[30, 1, 2], [31, 3, 4], [32, 5, 6]]
    assert parents.tolist() == [[-1, 0, 1], [-1, 0, 0], [-1, 0, 1]]
    assert order.tolist() == [[0, 1], [0, 1], [0, 1]]


# ---------------------------------------------------------------------- the final draw's distribution
def test_final_draw_weights_per_row_with_the_fallback_to_p():
    """Three requests, a root with one child (token 1) each, V = 3. Target-only: row 0's child took
    all of p, so nothing is left and the full p comes back (in that row only); row 1 loses its
    child's token; row 2 ended on the child, a leaf: its full p."""
    tokens = torch.tensor([[0, 1]] * 3)
    children = spec_tree._children(torch.tensor([[-1, 0]] * 3), 1)
    p = torch.tensor([[[0.0, 1.0, 0.0], [0.3, 0.3, 0.4]],
                      [[0.2, 0.5, 0.3], [0.3, 0.3, 0.4]],
                      [[0.2, 0.5, 0.3], [0.1, 0.2, 0.7]]], dtype=f64)
    last = torch.tensor([0, 0, 1])
    w = spec_accept._final_draw_weights(p, tokens, children, last, None)
    assert w.tolist() == [[0.0, 1.0, 0.0], [0.2, 0.0, 0.3], [0.1, 0.2, 0.7]]
    # rejection: max(p - q of the child, 0); row 0's q equals p there: nothing left, the full p
    q = torch.zeros(3, 2, 3, dtype=f64)
    q[0, 1] = torch.tensor([0.0, 1.0, 0.0], dtype=f64)
    q[1, 1] = torch.tensor([0.5, 0.5, 0.0], dtype=f64)
    q[2, 1] = torch.tensor([0.5, 0.5, 0.0], dtype=f64)
    w = spec_accept._final_draw_weights(p, tokens, children, last, q)
    assert w.tolist() == [[0.0, 1.0, 0.0], [0.0, 0.0, 0.3], [0.1, 0.2, 0.7]]


# ---------------------------------------------------------------------- the round's step 3 (_accept_step)
def by_hand_residual(tree: Tree, p: torch.Tensor, last: int, q: torch.Tensor | None) -> torch.Tensor:
    """DESIGN §6's correction distribution at the last accepted node, node by node."""
    kids = tree.children(last)
    if not kids:
        return p[last]
    if q is None:
        residual = p[last].clone()
        residual[[tree.tokens[c] for c in kids]] = 0
    else:
        residual = (p[last] - q[kids[0]]).clamp(min=0)
    return residual if bool((residual > 0).any()) else p[last]


def test_accept_step_decides_every_request_by_its_own_rule_and_coins():
    """_accept_step on a batch of three requests given in another order than their indices: a
    greedy one, a seeded sampled one (verify_coins at its committed length) and an unseeded one
    (the run's generator, N + 1 draws): each request's accepted nodes and tokens, bonus, final
    distribution and final coin are the node-by-node rules' (the tests' own re-implementations)
    on p = target_probs of its node logits. A fake run (no model): the step reads only these."""
    V, rng, g = 6, random.Random(11), torch.Generator().manual_seed(11)
    requests = [Request([1, 2, 3], SamplingParams(temperature=0)),
                Request([1, 2, 3], SamplingParams(temperature=0.8), seed=2 ** 64 - 5),
                Request([1, 2, 3], SamplingParams(temperature=1.0, top_k=4))]
    lengths = {0: 5, 1: 9, 2: 7}
    active = [2, 0, 1]                                           # row a holds request active[a]
    shapes = {"target-only": ([[-1, 0, 0, 1], [-1, 0, 1, 1], [-1, 0, 0, 2]], 2, 2),
              "rejection": ([[-1, 0, 1, 2]] * 3, 1, 3)}
    for trial in range(24):
        mode = ("target-only", "rejection")[trial % 2]
        parents, K, steps = shapes[mode]
        ts, ta = (0.6, 0.7) if mode == "target-only" and trial % 4 == 0 else (1.0, 1.0)
        sp = SpecParams(num_steps=steps, topk=K, draft_token_num=4, verify=mode, threshold_single=ts,
                        threshold_acc=ta)
        N, W = 4, min(steps, 3) + 1
        trees = []
        for par in parents:
            toks = [rng.randrange(V)]
            for i in range(1, N):
                used = {toks[c] for c in range(1, i) if par[c] == par[i]}
                toks.append(rng.choice([t for t in range(V) if t not in used]))
            trees.append(Tree(toks, par))
        logits = torch.randn(3, N, V, generator=g) * 1.5
        for a, t in enumerate(trees):                            # mostly favour a child: drafts get accepted
            for i in range(N):
                if t.children(i) and rng.random() < 0.7:
                    logits[a, i, t.tokens[rng.choice(t.children(i))]] += 3
        q = torch.softmax(torch.randn(3, N, V, generator=g, dtype=f64), -1) if mode == "rejection" else None
        tokens, par_t = torch.tensor([t.tokens for t in trees]), torch.tensor(parents)
        run = SimpleNamespace(shape=SimpleNamespace(N=N, W=W), requests=requests, spec=sp,
                              state=SimpleNamespace(length=lambda i: lengths[i]), target=TORCH_TARGET,
                              generator=torch.Generator().manual_seed(trial))
        rin = SimpleNamespace(active=active, greedy=[requests[i].params.is_greedy for i in active])
        ver = SimpleNamespace(tokens=tokens, lay=SimpleNamespace(children=spec_tree._children(par_t, K)), node_logits=logits)
        acc = spec_round._accept_step(run, rin, TreeBatch(tokens, par_t, q), ver)

        draws = torch.Generator().manual_seed(trial)
        assert acc.sampled == [0, 2]
        for a, (i, t) in enumerate(zip(active, trees)):
            argmax = logits[a].argmax(-1).tolist()
            if requests[i].params.is_greedy:
                nodes = [0]
                while (nxt := next((c for c in t.children(nodes[-1]) if t.tokens[c] == argmax[nodes[-1]]), None)) \
                        is not None:
                    nodes.append(nxt)
            else:
                m = acc.sampled.index(a)
                if requests[i].seed is None:
                    u = torch.rand(N + 1, generator=draws, dtype=torch.float32).clamp(max=COIN_MAX)
                    c, fin = u[:N], u[N]
                else:
                    c, f = verify_coins(torch.tensor([seed_as_int64(requests[i].seed)]), torch.tensor([lengths[i]]), N)
                    c, fin = c[0], f[0]
                assert acc.final_coins[m].item() == fin.item(), (trial, a)
                p = torch.stack([target_probs(logits[a, n], requests[i].params) for n in range(N)])
                if q is not None:
                    t.q = [None] + [q[a, n] for n in range(1, N)]
                rule = target_only()(t, p, c, float(fin), ts, ta) if q is None else rejection()(t, p, c, float(fin))
                nodes, token = rule
                assert torch.equal(acc.weights[m], by_hand_residual(t, p, nodes[-1], None if q is None else q[a])), \
                    (trial, a)
                assert inverse_cdf_rows(acc.weights[m:m + 1], acc.final_coins[m:m + 1]) == [token]
            padded = nodes + [nodes[-1]] * (W - len(nodes))
            assert acc.acc_nodes[a].tolist() == padded and acc.last[a].item() == nodes[-1], (trial, a, mode)
            assert acc.ints[a].tolist() == ([len(nodes)] + [t.tokens[n] for n in padded] + [argmax[nodes[-1]]]
                                            + padded), (trial, a, mode)


# ---------------------------------------------------------------------- the device of every tensor
@pytest.mark.parametrize("mode", ["target-only", "rejection"])
def test_the_acceptance_makes_no_tensor_on_the_default_device(mode):
    """In a round these helpers run on the target's device (a GPU) with no host read. Run on the
    "meta" device (shapes, no data), a tensor made on the CPU by default meets the inputs in an
    operation and torch refuses the mix, as CUDA would; the CPU tests cannot see it otherwise."""
    m = "meta"
    parents = torch.tensor([[-1, 0, 1, 2], [-1, 0, 1, 2]] if mode == "rejection" else [[-1, 0, 0, 1], [-1, 0, 1, 2]],
                           device=m)
    K = 1 if mode == "rejection" else 2
    lay = spec_tree._layout(parents, 3, 4, K)
    assert {t.device.type for t in (lay.path_nodes, lay.valid, lay.node_row, lay.node_path, lay.children)} == {m}
    tokens, logits = torch.zeros(2, 4, dtype=torch.int64, device=m), torch.zeros(2, 4, 6, device=m)
    q = torch.zeros(2, 4, 6, dtype=f64, device=m) if mode == "rejection" else None
    requests = [Request([1, 2], SamplingParams(temperature=0.8), seed=3), Request([1, 2], SamplingParams(temperature=1.0))]
    run = SimpleNamespace(shape=SimpleNamespace(N=4, W=4), requests=requests,
                          spec=SpecParams(num_steps=3, topk=K, draft_token_num=4, verify=mode),
                          state=SimpleNamespace(length=lambda i: 5), generator=torch.Generator().manual_seed(0),
                          target=TORCH_TARGET)
    rin = SimpleNamespace(active=[1, 0], greedy=[False, False])          # unseeded, then seeded
    acc = spec_round._accept_step(run, rin, TreeBatch(tokens, parents, q), SimpleNamespace(tokens=tokens, lay=lay,
                                                                                    node_logits=logits))
    assert {t.device.type for t in (acc.acc_nodes, acc.last, acc.ints, acc.weights, acc.final_coins)} == {m}
    assert acc.ints.shape == (2, 2 + 2 * 4) and acc.weights.shape == (2, 6)
    choice = spec_accept._accept_greedy(tokens, lay.children, torch.zeros(2, 4, dtype=torch.int64, device=m))
    nodes, count = spec_accept._walk(choice, 4)
    assert (nodes.device.type, count.device.type) == (m, m)
    tokens, parents, order = spec_tree.number_tree(torch.zeros(2, dtype=torch.int64, device=m),
                                              torch.zeros(2, 5, dtype=torch.int64, device=m),
                                              torch.tensor([[-1, -1, 0, 0, 1]] * 2, device=m),
                                              torch.zeros(2, 5, dtype=f64, device=m), 4)
    assert {t.device.type for t in (tokens, parents, order)} == {m} and parents.shape == (2, 4)
