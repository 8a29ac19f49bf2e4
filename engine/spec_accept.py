"""The acceptance rules of DESIGN §6, written once and batched over every node of every tree:
greedy, target-only and rejection, the walk from the root, the final draw's distribution and its
inverse-CDF draw on the host (DESIGN §5). verify_greedy / verify_target_only / verify_rejection
are the same code on a batch of one host tree: the verify specs and the default target call them,
so a spec pins what the round runs."""

from __future__ import annotations

from typing import Sequence

import torch

from lockstep.engine.request import SamplingParams, seed_as_int64
from lockstep.engine.sampling import Sampler, host_to, keep_mask
from lockstep.engine.spec_tree import Tree, _children
from lockstep.kernels import portable
from lockstep.kernels.coins import COIN_MAX, verify_coins


def inverse_cdf(weights: torch.Tensor, coin: float) -> int:
    """inverse_cdf_rows on one row: the first index whose float64 running sum (left to right)
    exceeds coin * total, among ids with non-zero weight (DESIGN §5). A coin outside [0, 1) is
    refused (an unclamped float32 coin of 1.0 would walk past the CDF)."""
    if not 0.0 <= float(coin) < 1.0:
        raise ValueError(f"inverse_cdf: coin must be in [0, 1), got {float(coin)!r}")
    return inverse_cdf_rows(weights.to("cpu", torch.float64)[None],
                            torch.tensor([float(coin)], dtype=torch.float64))[0]


def _one_tree(tree: Tree) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A host tree as a batch of one: (tokens [1, N], children [1, N, K] as _layout numbers them,
    W = the deepest path's node count, so _walk can reach every leaf)."""
    parents = tree.parents
    depth = [0] * len(parents)
    for i in range(1, len(parents)):                   # parents[i] < i
        depth[i] = depth[parents[i]] + 1
    K = max([parents[1:].count(p) for p in set(parents[1:])] or [1])
    return torch.tensor([tree.tokens]), _children(torch.tensor([parents]), K), max(depth) + 1


def _outcome(choice: torch.Tensor, W: int, next_token) -> tuple[list[int], int]:
    """Walk the chosen children (_walk) -> (accepted nodes incl. root, next token of the last one)."""
    nodes, count = _walk(choice, W)
    return nodes[0, :int(count[0])].tolist(), int(next_token(nodes[:, -1]))


def verify_greedy(tree: Tree, argmax: Sequence[int]) -> tuple[list[int], int]:
    """argmax[i]: target argmax at node i. -> (accepted nodes incl. root, bonus token)."""
    tokens, children, W = _one_tree(tree)
    am = torch.tensor([list(argmax)], dtype=torch.int64)
    return _outcome(_accept_greedy(tokens, children, am), W, lambda last: am[0, last[0]])


def verify_target_only(tree: Tree, p: torch.Tensor, coins: torch.Tensor, final_coin: float,
                       threshold_single: float = 1.0, threshold_acc: float = 1.0) -> tuple[list[int], int]:
    """DESIGN §6 target-only. p [N, V]: target sampling distribution at each node (float64).
    coins [N]: node i's children are tried with coins[i]; final_coin draws the last token.
    A zero-probability child is never accepted (it is no inverse-CDF outcome either)."""
    tokens, children, W = _one_tree(tree)
    p = p.to(torch.float64)[None]
    choice = _accept_target_only(tokens, children, p, coins[None], threshold_single, threshold_acc)
    return _outcome(choice, W, lambda last: _final_draw(p, tokens, children, last, None, final_coin))


def verify_rejection(tree: Tree, p: torch.Tensor, coins: torch.Tensor, final_coin: float
                     ) -> tuple[list[int], int]:
    """Leviathan et al. on a chain: node i (drawn from q_i = tree.q[i]) is accepted iff
    coins[parent] * q_i(x) < p_parent(x); on rejection draw from normalize(max(p - q_i, 0)) with
    final_coin; if all accepted, the bonus comes from p at the last node."""
    if len(set(tree.parents[1:])) != len(tree.parents) - 1:
        raise ValueError("verify_rejection: the tree must be a chain (topk=1)")
    tokens, children, W = _one_tree(tree)
    p = p.to(torch.float64)[None]
    q = torch.stack([torch.zeros_like(p[0, 0])] + [row.to(torch.float64) for row in tree.q[1:]])[None]
    choice = _accept_rejection(tokens, children, p, q, coins[None])
    return _outcome(choice, W, lambda last: _final_draw(p, tokens, children, last, q, final_coin))


def _final_draw(p, tokens, children, last, q, final_coin: float) -> int:
    """The round's final draw for a batch of one: _final_draw_weights, then inverse_cdf_rows."""
    w = _final_draw_weights(p, tokens, children, last, q)
    return inverse_cdf_rows(w.cpu(), torch.tensor([float(final_coin)], dtype=torch.float64))[0]


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The target's sampling distribution (float64): temperature, then top-k/top-p/min-p masks,
    renormalized (the same masks as engine.sampling)."""
    z = logits.to(torch.float64) / params.temperature
    keep = keep_mask(z, params.top_k, params.top_p, params.min_p)
    return portable.softmax(torch.where(keep, z, float("-inf")), dim=-1)


# The acceptance's one call into the sampler (the target model's `ops.sampler`; the round's chosen
# logprobs call it directly); nothing else in this module samples or filters a target row.
def _target_distributions(sampler: Sampler, logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """target_probs of every node row: logits [M, N, V] fp32, params[m] for request m -> [M, N, V]
    float64, all rows at once (either sampler gives target_probs' bits); no host read."""
    M, N, V = logits.shape
    rows = sampler.distributions(logits.reshape(M * N, V), [prm for prm in params for _ in range(N)])
    return rows.view(M, N, V)


def _accept_greedy(tokens: torch.Tensor, children: torch.Tensor, argmax: torch.Tensor) -> torch.Tensor:
    """The greedy step at every node at once: the first child whose token is the node's
    target argmax, or -1. tokens, argmax [R, N]; children [R, N, K] -> [R, N]."""
    kid_tok = tokens.gather(1, children.clamp(min=0).flatten(1)).view(children.shape)
    ok = (children >= 0) & (kid_tok == argmax[:, :, None])
    return _first(ok, children)


def _accept_target_only(tokens: torch.Tensor, children: torch.Tensor, p: torch.Tensor, coins: torch.Tensor,
                        threshold_single: float, threshold_acc: float) -> torch.Tensor:
    """The target-only step at every node at once: siblings in ascending order, acc the float64
    running sum of their target probabilities (left to right); child j is accepted iff its p > 0
    and (coin <= acc / threshold_acc or p >= threshold_single); the first accepted child wins."""
    kid_tok = tokens.gather(1, children.clamp(min=0).flatten(1)).view(children.shape)
    pc = p.gather(2, kid_tok)                                                   # [R, N, K] float64
    u = coins.to(torch.float64)
    acc = torch.zeros_like(u)
    ok = []
    for j in range(children.shape[2]):                          # K siblings: a fixed, small count
        acc = acc + pc[:, :, j]
        ok.append((children[:, :, j] >= 0) & (pc[:, :, j] > 0)
                  & ((u <= acc / threshold_acc) | (pc[:, :, j] >= threshold_single)))
    return _first(torch.stack(ok, dim=2), children)


def _accept_rejection(tokens: torch.Tensor, children: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                      coins: torch.Tensor) -> torch.Tensor:
    """The rejection test at every node of the chains: child c (drawn from q_c) is kept iff
    coin * q_c(x) < p(x)."""
    kid = children[:, :, 0].clamp(min=0)
    x = tokens.gather(1, kid)
    q_own = q.gather(2, tokens[:, :, None])[:, :, 0]                            # q_c(token of c), every node c
    qx = q_own.gather(1, kid)
    px = p.gather(2, x[:, :, None])[:, :, 0]
    return torch.where((children[:, :, 0] >= 0) & (coins.to(torch.float64) * qx < px), kid, -1)


def _first(ok: torch.Tensor, children: torch.Tensor) -> torch.Tensor:
    """The first child with ok, or -1: ok, children [R, N, K] -> [R, N]."""
    j = torch.where(ok, torch.arange(ok.shape[2], device=ok.device), ok.shape[2]).amin(dim=2)
    picked = children.gather(2, j.clamp(max=ok.shape[2] - 1)[:, :, None])[:, :, 0]
    return torch.where(j < ok.shape[2], picked, -1)


def _walk(choice: torch.Tensor, W: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Follow the chosen children from the root: choice [R, N] -> (accepted nodes [R, W], padded
    with the last; count [R], root included)."""
    cur = torch.zeros(choice.shape[0], dtype=torch.int64, device=choice.device)
    alive = torch.ones_like(cur, dtype=torch.bool)
    path, count = [cur], torch.ones_like(cur)
    for _ in range(W - 1):
        nxt = choice.gather(1, cur[:, None])[:, 0]
        alive = alive & (nxt >= 0)
        cur = torch.where(alive, nxt, cur)
        count = count + alive.to(torch.int64)
        path.append(cur)
    return torch.stack(path, dim=1), count


def _accepted(tokens: torch.Tensor, choice: torch.Tensor, node_logits: torch.Tensor, W: int) -> tuple:
    """From every node's chosen child: the walk from the root (_walk) and what the host reads ->
    (accepted nodes [R, W], the last [R], ints [R, 2 + 2W]: count, accepted tokens (column 0 =
    the root), the bonus (the last node's target argmax), accepted nodes)."""
    R, V = tokens.shape[0], node_logits.shape[2]
    acc_nodes, n_acc = _walk(choice, W)
    last = acc_nodes[:, -1]
    bonus = torch.argmax(node_logits.gather(1, last[:, None, None].expand(R, 1, V))[:, 0], -1)
    ints = torch.cat([n_acc[:, None], tokens.gather(1, acc_nodes), bonus[:, None], acc_nodes], dim=1)
    return acc_nodes, last, ints


def _final_draw_weights(p: torch.Tensor, tokens: torch.Tensor, children: torch.Tensor, last: torch.Tensor,
                        q: torch.Tensor | None) -> torch.Tensor:
    """The distribution the bonus/correction token is drawn from, per request: p [R, N, V] at the
    last accepted node last [R]; if it has children (they were all rejected), minus q of its child
    (rejection: q [R, N, V]) or minus the children's mass (target-only: q None), clamped at 0,
    and the full p where nothing is left."""
    p_last = p.gather(1, last[:, None, None].expand(-1, 1, p.shape[2]))[:, 0]
    kids_last = children.gather(1, last[:, None, None].expand(-1, 1, children.shape[2]))[:, 0]   # [R, K]
    if q is not None:
        removed = q.gather(1, kids_last[:, :1, None].clamp(min=0).expand(-1, 1, q.shape[2]))[:, 0]
    else:
        kid_tok = tokens.gather(1, kids_last.clamp(min=0))                     # [R, K]
        ids = torch.arange(p_last.shape[1], device=p.device)
        mask = ((ids == kid_tok[:, :, None]) & (kids_last >= 0)[:, :, None]).any(dim=1)
        removed = torch.where(mask, p_last, 0.0)                               # p - removed: exact zeros there
    residual = (p_last - removed).clamp(min=0)
    residual = torch.where((residual > 0).any(dim=1, keepdim=True), residual, p_last)
    return torch.where((kids_last >= 0).any(dim=1, keepdim=True), residual, p_last)


def inverse_cdf_rows(weights: torch.Tensor, coins: torch.Tensor) -> list[int]:
    """inverse_cdf for each row of host tensors weights [M, V] float64, coins [M]: torch's CPU
    cumsum along a row is the same left-to-right float64 loop as portable.running_sum."""
    if weights.device.type != "cpu":
        raise ValueError("inverse_cdf_rows: the running sums are taken on the CPU (DESIGN §5)")
    c = coins.to(torch.float64)
    if not bool(((c >= 0) & (c < 1)).all()):
        raise ValueError(f"inverse_cdf_rows: coins must be in [0, 1), got {c.tolist()!r}")
    w = weights.to(torch.float64).clamp(min=0)
    cs = torch.cumsum(w, dim=1)
    pos = w > 0
    if not bool(pos.any(dim=1).all()):
        raise ValueError("inverse_cdf_rows: all weights are zero")
    hit = (cs > c[:, None] * cs[:, -1:]) & pos
    V = w.shape[1]
    ar = torch.arange(V)
    first = torch.where(hit, ar, V).amin(dim=1)
    last_nz = torch.where(pos, ar, -1).amax(dim=1)
    return torch.where(first < V, first, last_nz).tolist()


def _read_round(ints: torch.Tensor, weights: torch.Tensor | None, final_coins: torch.Tensor | None
                ) -> tuple[list, list[int]]:
    """THE host read of a round: the accepted counts and tokens (ints [R, C] int64) and, when
    some requests sample, the float64 rows their final draw needs and its coins (bit-cast into
    the same transfer); then those draws on the host (inverse_cdf_rows: DESIGN §5 fixes a
    left-to-right running sum, which is a CPU loop). -> (ints as lists, sampled final tokens)."""
    parts = [ints.reshape(-1)]
    if weights is not None:
        parts += [weights.reshape(-1).view(torch.int64), final_coins.to(torch.float64).view(torch.int64)]
    host = torch.cat(parts).cpu()
    n = ints.numel()
    if weights is None:
        return host[:n].view(ints.shape).tolist(), []
    m = weights.numel()
    w = host[n:n + m].view(torch.float64).view(weights.shape)
    return host[:n].view(ints.shape).tolist(), inverse_cdf_rows(w, host[n + m:].view(torch.float64))


def _coins(requests, which: list[int], seq_lens: list[int], N: int, generator, device
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify coins [M, N] and final coins [M] (float32) for the sampled requests `which`:
    seeded ones by hash at n = committed length (one verify_coins call), the others from the
    generator (N + 1 draws each, in order)."""
    coins = torch.empty((len(which), N), dtype=torch.float32, device=device)
    fin = torch.empty(len(which), dtype=torch.float32, device=device)
    seeded = [m for m, i in enumerate(which) if requests[i].seed is not None]
    if seeded:
        c, f = verify_coins(host_to(device, [seed_as_int64(requests[which[m]].seed) for m in seeded]),
                            host_to(device, [seq_lens[m] for m in seeded]), N)
        at = host_to(device, seeded)
        coins[at], fin[at] = c, f
    for m, i in enumerate(which):
        if requests[i].seed is None:
            u = torch.rand(N + 1, generator=generator, dtype=torch.float32).clamp(max=COIN_MAX).to(device)
            coins[m], fin[m] = u[:N], u[N]
    return coins, fin
