"""Speculative decoding with an EAGLE3 draft: chain and tree drafting, three verify modes (DESIGN §6).

    results = speculative_generate(target, draft, [Request(...), ...], SpecParams(topk=2, num_steps=3,
                                                                                  draft_token_num=6))

State of a request between rounds: its committed tokens x_0 .. x_{n-1} (prompt plus output; x_{n-1},
the root, has not been through the target yet). The target's KV cache holds positions 0 .. n-2 and
the draft's committed KV holds positions 0 .. n-2 (always computed from target features: the draft
step at position t sees the target feature h_t and the embedding of x_{t+1}).

The loop (speculative_generate): `prefill`, then `speculative_decode` runs rounds until every
request has finished; a `_SpecRun` holds what the rounds share, its decoding state the
engine.generate.Decoding of plain generation (tokens, finish, logprob rows, stop rule).

One round (_round: _round_inputs, _draft_step, _verify_step, _accept_step, _read_round,
_commit), for every unfinished request at once: each step below is a few batched
device calls over all requests (no per-request Python, no host read), up to the round's one
host read (_read_round, step 3); a row is computed alone, so a request's result does not
depend on its batchmates:

  1. Draft (engine.eagle3; _draft_trees). Depth 1 comes from the draft's last committed row
     (position n-2). Each further step expands the current beams: a beam node at depth d runs a
     draft step at position n-2+d over the committed draft keys, its tree ancestors' keys and its
     own. Tree (topk > 1): every beam's top-k children are candidates (score = sum of draft
     log-probs, float64), the best topk of them become the next beams; after num_steps depths the
     best draft_token_num - 1 candidates (score descending, creation order on ties; a parent
     always precedes its child) form the tree, numbered in creation order; node 0 is the root.
     Deterministic top-k drafting (lowest draft id on ties) for `greedy` and `target-only`;
     `rejection` samples each draft token from q = softmax(draft logits / temperature) with
     Gumbel-max on its own stream: murmur(seed, pos, DRAFT_COLUMNS + draft id), pos = the
     sequence position of the proposed token.
  2. Verify (target; _layout). Every root-to-leaf path of the tree runs as a chain at the real
     positions n-1 .. n-1+depth: path 0 in the request's own KV slot, every other path in a
     scratch slot whose first n-1 positions first receive a copy of the request's slot (one
     copy over all layers: KVCache.copy_prefix). The call has a fixed shape, P paths of W rows
     per request (a chain: one path of N rows); rows past a path's leaf are padding that write
     only positions no query reads before they are written again. A node's logits are then
     computed exactly as in sequential decoding (same keys, same order; DESIGN D3), so greedy
     speculative decoding reproduces engine.generate bit for bit, logprobs included.
  3. Accept: the rules exist once, batched over every node of every tree at once
     (_accept_greedy, _accept_target_only, _accept_rejection, then _walk and _final_draw_weights);
     verify_greedy / verify_target_only / verify_rejection are that code on a batch of one tree
     (what the verify specs and the default target run), with coins from kernels.coins.verify_coins(seed, n, N) (n = committed length,
     root included) or, without a seed, from the explicit generator. The host read: accepted
     counts, nodes and tokens, and for sampled requests the distribution of the final draw,
     which is then drawn on the host (inverse_cdf_rows: DESIGN §5's left-to-right running sum).
  4. Commit: the accepted tokens and the bonus/correction token are appended (stopping at a stop
     id or max_new_tokens, as engine.generate does); their logprobs stay on the device until the
     end. Target KV: the accepted path's positions are copied back into the request's slot (one
     indexed copy over all layers for all requests: KVCache.copy_positions; a no-op copy for
     path 0); the rejected rows are never read again (rollback = they are overwritten before any
     query can see them). Draft KV: tree rows were never written; a draft extend over the newly
     committed positions (target features from the verify rows; W rows per request, the ones
     past the accepted count again padding) writes them and yields the next round's depth 1.

The round replays CUDA graphs on a GPU (engine.graphs.RoundGraphs, owned by the run with its
caches), each per shape: the verify layout, the verify call, a greedy round's acceptance, the
chosen logprobs, and on the draft's cached path (bf16 policy) the whole draft tree and the draft
extend; the same kernels with the same arguments as the eager calls, so the same bits. What needs
the host (the sampled acceptance's row lists and generator coins, rows drawing from an unseeded
generator, the KV copies sized by a host int, the bookkeeping) and the fp32 portable head stay eager.

The per-row sampling helpers (_target_distributions, _chosen_logprobs) are the one place this
module calls engine.sampling's row functions in a round: a batched sampler goes there.

The first output token comes from the prefill logits through engine.sampling.sample (Gumbel at
position prompt_len - 1), exactly as in engine.generate. Logprobs: log_softmax of the raw fp32
target logits at the chosen token. Accept length of a round = accepted draft tokens + 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from lockstep.engine.eagle3 import DraftKV, Eagle3Draft
from lockstep.engine.generate import Decoding, generator_for, observing, validate_request
from lockstep.engine.graphs import RoundGraphs, round_graphs
from lockstep.engine.model import GptOssModel
from lockstep.engine.request import Request, Result, SamplingParams, seed_as_int64
from lockstep.kernels.moe import top_k_lowest_index
from lockstep.engine.sampling import chosen_logprob, chosen_logprobs, host_to, keep_mask, sample, target_distributions
from lockstep.kernels import portable
from lockstep.kernels.coins import COIN_MAX, DRAFT_COLUMNS, gumbel_from_hash, gumbel_noise, verify_coins

VERIFY_MODES = ("greedy", "target-only", "rejection")


@dataclass(frozen=True)
class SpecParams:
    """num_steps: draft depth. topk: children per beam (1 = chain). draft_token_num: tree nodes N,
    root included (chain: at most num_steps + 1). verify: mode for sampled requests (greedy
    requests are always verified greedily; verify='greedy' requires every request to be greedy).
    threshold_single / threshold_acc: target-only acceptance knobs, in (0, 1]."""
    num_steps: int = 3
    topk: int = 1
    draft_token_num: int = 4
    verify: str = "target-only"
    threshold_single: float = 1.0
    threshold_acc: float = 1.0

    def __post_init__(self):
        def bad(name, why):
            raise ValueError(f"SpecParams.{name}: {why}, got {getattr(self, name)!r}")

        for name in ("num_steps", "topk", "draft_token_num"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                bad(name, "must be an int >= 1")
        if self.draft_token_num < 2:
            bad("draft_token_num", "must be >= 2 (the root and at least one draft token)")
        most = 1 + self.topk + (self.num_steps - 1) * self.topk * self.topk
        if self.draft_token_num > most:
            bad("draft_token_num", f"must be <= 1 + topk + (num_steps - 1) * topk^2 = {most} "
                                   f"(topk={self.topk}, num_steps={self.num_steps})")
        if self.verify not in VERIFY_MODES:
            bad("verify", f"must be one of {VERIFY_MODES}")
        for name in ("threshold_single", "threshold_acc"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                bad(name, "must be in (0, 1]")
        if self.verify == "rejection":
            if self.topk != 1:
                bad("topk", "verify='rejection' needs a chain (topk=1)")
            if self.threshold_single != 1.0 or self.threshold_acc != 1.0:
                bad("threshold_acc" if self.threshold_acc != 1.0 else "threshold_single",
                    "verify='rejection' ignores thresholds; leave them at 1.0")


# ---------------------------------------------------------------------- trees
@dataclass
class Tree:
    """Node 0 is the root; parents[i] < i; siblings are tried in ascending node index."""
    tokens: list[int]                                   # target ids
    parents: list[int]                                  # parents[0] = -1
    q: list[torch.Tensor | None] = field(default_factory=list)   # rejection: q (target vocab) that drew node i

    def __post_init__(self):
        if len(self.tokens) != len(self.parents) or not self.parents or self.parents[0] != -1:
            raise ValueError("Tree: tokens and parents must have one entry per node, parents[0] = -1")
        for i, p in enumerate(self.parents[1:], 1):
            if not 0 <= p < i:
                raise ValueError(f"Tree: parent of node {i} must be in [0, {i}), got {p}")

    def children(self, i: int) -> list[int]:
        return [c for c in range(i + 1, len(self.parents)) if self.parents[c] == i]

    def depth(self, i: int) -> int:
        d = 0
        while i > 0:
            i, d = self.parents[i], d + 1
        return d

    def paths(self) -> list[list[int]]:
        """Root-to-leaf node lists, by ascending leaf index."""
        leaves = [i for i in range(len(self.parents)) if not self.children(i)]
        out = []
        for leaf in leaves:
            path, i = [], leaf
            while i >= 0:
                path.append(i)
                i = self.parents[i]
            out.append(path[::-1])
        return out


# ---------------------------------------------------------------------- verify (one tree)
# The rules of DESIGN §6 exist once: the batched acceptance the round runs (_accept_greedy,
# _accept_target_only, _accept_rejection, _walk, _final_draw_weights, inverse_cdf_rows, below).
# These functions are that code on a batch of one host-made tree: the verify specs and the
# default target call them, so a spec pins what the round runs.
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


# ---------------------------------------------------------------------- per-row sampling (swap point)
# The loop's only calls into engine.sampling's per-row functions. A batched sampler replaces the
# bodies of these two helpers; nothing else in this module samples or filters a target row.
def _target_distributions(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """target_probs of every node row: logits [M, N, V] fp32, params[m] for request m -> [M, N, V]
    float64, all rows at once (engine.sampling.target_distributions: the fused kernel on a GPU,
    the batched torch path elsewhere; either gives target_probs' bits); no host read."""
    M, N, V = logits.shape
    rows = target_distributions(logits.reshape(M * N, V), [prm for prm in params for _ in range(N)])
    return rows.view(M, N, V)


def _chosen_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """chosen_logprob for many rows at once: logits [M, V], tokens [M] -> [M] fp32, through
    engine.sampling.chosen_logprobs' torch path on every device (portable.log_softmax of the fp32
    rows: chosen_logprob's bits). Its fused kernel gives the same bits; the round keeps the torch
    path until the speculative CUDA goldens are re-checked with the kernel in the round's graph."""
    return chosen_logprobs(logits, tokens, fused=False)


# ---------------------------------------------------------------------- drafting helpers
def draft_top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic drafting: the k most likely draft ids of draft logits [..., V_draft], by
    log-prob (float64) descending, equal log-probs by the lower draft id -> (log-probs, ids) [..., k]."""
    logp = portable.log_softmax(logits.to(torch.float64), dim=-1)
    return top_k_lowest_index(logp, k)


def _each(t: torch.Tensor, k: int) -> torch.Tensor:
    """Every element of the 1-D t, k times in a row (repeat_interleave by a constant, as a view
    expansion: no data-dependent size)."""
    return t[:, None].expand(t.shape[0], k).reshape(-1)


@dataclass
class _DraftRows:
    """What drafting needs to know about each row's request (one entry per row, on the device).
    sampled: rows drawn from q (rejection mode, sampled request); seeds/seeded: the DRAFT stream;
    unseeded: host list of the sampled rows without a seed (drawn from the generator, in order)."""
    sampled: torch.Tensor            # [M] bool
    temperature: torch.Tensor        # [M] float64 (1.0 where not sampled)
    seeds: torch.Tensor              # [M] int64 (0 where unseeded)
    unseeded: list[int]
    any_sampled: bool

    def repeat(self, k: int) -> "_DraftRows":
        """Each row k times in a row (the beams of one request)."""
        return _DraftRows(_each(self.sampled, k), _each(self.temperature, k), _each(self.seeds, k),
                          [u * k + j for u in self.unseeded for j in range(k)], self.any_sampled)


def _draft_children_rows(hot_ids: torch.Tensor, vocab_size: int, logits: torch.Tensor, rows: _DraftRows, topk: int,
                         pos: torch.Tensor, generator: torch.Generator | None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Children of M nodes at once: draft logits [M, V_draft] -> (draft ids [M, k], log-probs [M, k]
    float64, q over the target vocab [M, k, V] float64 or None). Deterministic rows: draft_top_k.
    Sampled rows (k = 1): Gumbel-max on q = softmax(logits / temperature), noise
    murmur(seed, pos, DRAFT_COLUMNS + id), or for unseeded rows torch.randint draws from
    `generator`, one row after another in row order."""
    lp, ids = draft_top_k(logits, topk)
    if not rows.any_sampled:
        return ids, lp, None
    if topk != 1:
        raise ValueError("sampled drafting needs topk=1")
    M, Vd = logits.shape
    dev = logits.device
    logq = portable.log_softmax(logits.to(torch.float64) / rows.temperature[:, None], dim=-1)
    g = gumbel_noise(rows.seeds, pos.to(torch.int64), DRAFT_COLUMNS + torch.arange(Vd, dtype=torch.int64, device=dev))
    if rows.unseeded:
        h = torch.randint(0, 1 << 32, (len(rows.unseeded), Vd), dtype=torch.int64, generator=generator)
        g[torch.tensor(rows.unseeded, device=dev)] = gumbel_from_hash(h.to(dev))
    d = torch.argmax(logq + g, dim=-1)                                        # first maximum
    q = torch.zeros((M, vocab_size), dtype=torch.float64, device=dev)
    q[:, hot_ids] = portable.exp(logq)
    ids = torch.where(rows.sampled[:, None], d[:, None], ids)
    lp = torch.where(rows.sampled[:, None], logq.gather(1, d[:, None]), lp)
    return ids, lp, q[:, None]


def _draft_children(draft: Eagle3Draft, logits: torch.Tensor, params: SamplingParams, topk: int,
                    sampled: bool, seed: int | None, pos: int, generator: torch.Generator | None
                    ) -> list[tuple[int, float, torch.Tensor | None]]:
    """One node's children (draft logits [V_draft]) -> [(draft id, log-prob, q or None)]: the
    batched _draft_children_rows on a single row (tests use it as the draft sampler)."""
    dev = logits.device
    rows = _DraftRows(torch.tensor([sampled], device=dev),
                      torch.tensor([params.temperature if sampled else 1.0], dtype=torch.float64, device=dev),
                      torch.tensor([seed_as_int64(seed) if sampled and seed is not None else 0], device=dev),
                      [0] if sampled and seed is None else [], sampled)
    ids, lp, q = _draft_children_rows(draft.hot_ids, draft.config.vocab_size, logits[None], rows, topk,
                                      torch.tensor([pos], device=dev), generator)
    return [(int(i), float(v), q[0, j] if sampled else None) for j, (v, i) in enumerate(zip(lp[0], ids[0]))]


@dataclass
class TreeBatch:
    """The draft trees of one round, one row per request, on the device; node 0 is the root and
    parents[:, i] < i (the numbering of `Tree`). q: rejection mode, the q that drew node i."""
    tokens: torch.Tensor              # [R, N] target ids
    parents: torch.Tensor             # [R, N] int64, parents[:, 0] = -1
    q: torch.Tensor | None            # [R, N, V] float64 (row 0 unused)

    def tree(self, a: int) -> Tree:
        """Request a's tree as a host `Tree` (host reads: for the trace and tests only)."""
        qs = [None] + ([self.q[a, i] for i in range(1, self.tokens.shape[1])] if self.q is not None
                       else [None] * (self.tokens.shape[1] - 1))
        return Tree(self.tokens[a].tolist(), self.parents[a].tolist(), qs)


def _draft_trees(draft: Eagle3Draft, dkv: DraftKV, slots: torch.Tensor, r: torch.Tensor, root_tok: torch.Tensor,
                 root_logits: torch.Tensor, root_h: torch.Tensor, rows: _DraftRows, spec: SpecParams,
                 generator: torch.Generator | None, kv_len: int | None, forward=None) -> TreeBatch:
    """One draft tree per request (module docstring, step 1), all requests at once on the device.
    slots, r (root positions), root_tok [R]; root_logits/root_h: the draft's last committed row.
    Candidates are numbered in creation order: depth 1's k, then per depth k beams x k children
    (beams in ascending candidate order). Every beam set and the final tree are stable
    descending sorts of the float64 scores, so equal scores go to the earlier candidate.
    kv_len: the portable head's attention bound (Eagle3Draft.forward; the cached path ignores it).
    `forward`: the draft forward to call (default draft.forward; the round's: RoundGraphs.draft_forward)."""
    R, K = r.shape[0], spec.topk
    forward = forward or draft.forward
    hot = draft.hot_ids
    ids, lp, q = _draft_children_rows(hot, draft.config.vocab_size, root_logits, rows, K, r + 1, generator)
    cand_tok, cand_parent, cand_score, cand_q = [hot[ids]], [torch.full_like(ids, -1)], [lp], [q]
    Kb = ids.shape[1]                                           # beams per request (= K)
    beam_cand = torch.arange(Kb, device=r.device).expand(R, Kb)
    beam_tok, beam_score = hot[ids], lp
    beam_h = root_h[:, None].expand(R, Kb, root_h.shape[-1])
    Hkv, D = dkv.k.shape[1], dkv.k.shape[3]
    anc_k = dkv.k.new_zeros((R, Kb, 0, Hkv, D))
    anc_v = dkv.v.new_zeros((R, Kb, 0, Hkv, D))
    beam_rows = rows.repeat(Kb)
    base = Kb
    beam_slots = _each(slots, Kb)
    if draft.cached and Kb > 1 and spec.num_steps > 1:          # tree rows write their keys: a slot per beam
        beam_slots = dkv.num_slots + beam_slots * Kb + torch.arange(Kb, device=r.device).repeat(R)
        # the whole slot (a fixed length, so the step can be captured): a tree row reads only its
        # prefix, which this copies, and the positions it writes itself first
        dkv.copy_prefix(beam_slots, _each(slots, Kb), dkv.k.shape[2])
    for d in range(2, spec.num_steps + 1):                      # beams sit at depth d - 1
        rr = _each(r, Kb)
        step = forward(beam_tok.reshape(-1), rr + d - 2, beam_h.reshape(R * Kb, -1), dkv,
                             beam_slots, commit=False, prefix_lens=rr,
                             ancestors=(anc_k.flatten(0, 1), anc_v.flatten(0, 1)), kv_len=kv_len)
        ids, lp, q = _draft_children_rows(hot, draft.config.vocab_size, step.logits, beam_rows, K, rr + d, generator)
        score = (beam_score[:, :, None] + lp.view(R, Kb, K)).reshape(R, Kb * K)   # creation order
        tok = hot[ids].view(R, Kb * K)
        cand_tok.append(tok)
        cand_parent.append(beam_cand[:, :, None].expand(R, Kb, K).reshape(R, Kb * K))
        cand_score.append(score)
        cand_q.append(None if q is None else q.view(R, Kb * K, -1))
        pick = _best(score, K)
        parent = pick // K                                      # which beam each new beam came from
        own_k, own_v = step.k.view(R, Kb, 1, Hkv, D), step.v.view(R, Kb, 1, Hkv, D)
        take = lambda t: t.gather(1, parent.view(R, K, *[1] * (t.dim() - 2)).expand(R, K, *t.shape[2:]))  # noqa: E731
        anc_k, anc_v = take(torch.cat([anc_k, own_k], dim=2)), take(torch.cat([anc_v, own_v], dim=2))
        beam_h = take(step.hidden.view(R, Kb, -1))
        beam_tok, beam_score, beam_cand = tok.gather(1, pick), score.gather(1, pick), base + pick
        Kb, base = K, base + Kb * K
        beam_rows = rows.repeat(Kb)
    tokens, parents, order = number_tree(root_tok, torch.cat(cand_tok, dim=1), torch.cat(cand_parent, dim=1),
                                         torch.cat(cand_score, dim=1), spec.draft_token_num)
    N = spec.draft_token_num
    qs = None
    if cand_q[0] is not None:
        allq = torch.cat(cand_q, dim=1)
        qs = torch.cat([allq[:, :1], allq.gather(1, order[:, :, None].expand(R, N - 1, allq.shape[-1]))], dim=1)
    return TreeBatch(tokens, parents, qs)


def _best(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The k best candidates of each row of scores [R, C]: score descending, equal scores to the
    earlier candidate (a stable sort), returned in candidate (creation) order -> [R, k]."""
    return torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k].sort(dim=1).values


def number_tree(root_tok: torch.Tensor, cand_tok: torch.Tensor, cand_parent: torch.Tensor, scores: torch.Tensor,
                N: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The draft tree of each request from its candidates (creation order; cand_parent = the
    parent's candidate index, -1 = the root; a child's score <= its parent's): the best N - 1
    (_best) become nodes 1 .. N-1 in creation order, node 0 is the root root_tok [R].
    -> (tokens [R, N], parents [R, N], the chosen candidates [R, N - 1])."""
    R = scores.shape[0]
    order = _best(scores, N - 1)
    node_of = torch.full_like(scores, -1, dtype=torch.int64)
    node_of.scatter_(1, order, torch.arange(1, N, device=scores.device).expand(R, N - 1))
    par = cand_parent.gather(1, order)
    parents = torch.where(par < 0, 0, node_of.gather(1, par.clamp(min=0)))
    parents = torch.cat([torch.full_like(parents[:, :1], -1), parents], dim=1)
    tokens = torch.cat([root_tok[:, None], cand_tok.gather(1, order)], dim=1)
    return tokens, parents, order


# ---------------------------------------------------------------------- verify layout and acceptance (batched)
@dataclass
class _Layout:
    """Where each tree node runs in the verify call. Rows are (request, path, depth): P paths of
    W rows per request, path p = the p-th leaf's root-to-leaf chain (ascending leaf index) at
    positions r .. r + depth, rows past a path's leaf (and paths past the last leaf) padding.
    node_row [R, N]: the node's row in its first path; valid [R, P, W]: real rows."""
    path_nodes: torch.Tensor          # [R, P, W] node index (padding: 0)
    valid: torch.Tensor               # [R, P, W] bool
    node_row: torch.Tensor            # [R, N] int64 into the flattened rows
    node_path: torch.Tensor           # [R, N] the path whose slot holds the node's row
    children: torch.Tensor            # [R, N, K] child nodes in ascending order, -1 = none


def _layout(parents: torch.Tensor, P: int, W: int, K: int) -> _Layout:
    R, N = parents.shape
    dev = parents.device
    par = parents.clamp(min=0)                                  # the root is its own parent here
    up = [torch.arange(N, device=dev).expand(R, N)]             # up[k][v]: v's ancestor k levels up
    for _ in range(W - 1):
        up.append(par.gather(1, up[-1]))
    up = torch.stack(up, dim=2)                                 # [R, N, W]
    depth = (up != 0).sum(dim=2)                                # [R, N]
    nodes = torch.arange(N, device=dev)
    has_child = torch.zeros((R, N), dtype=torch.bool, device=dev)
    has_child.scatter_(1, par[:, 1:], True)
    leaf = ~has_child
    leaf_order = torch.sort(torch.where(leaf, nodes, N + nodes), dim=1).indices[:, :P]   # ascending leaves
    path_exists = leaf.gather(1, leaf_order)                    # [R, P]
    leaf_depth = depth.gather(1, leaf_order)                    # [R, P]
    k = torch.arange(W, device=dev)
    valid = path_exists[:, :, None] & (k <= leaf_depth[:, :, None])             # [R, P, W]
    up_leaf = up.gather(1, leaf_order[:, :, None].expand(R, P, W))             # [R, P, W]
    path_nodes = up_leaf.gather(2, (leaf_depth[:, :, None] - k).clamp(min=0))
    path_nodes = torch.where(valid, path_nodes, 0)
    # a node's first path: the lowest path whose real rows hold it
    holds = (path_nodes[:, :, :, None] == nodes) & valid[:, :, :, None]         # [R, P, W, N]
    in_path = holds.any(dim=2)                                                  # [R, P, N]
    p_idx = torch.arange(P, device=dev)[None, :, None]
    node_path = torch.where(in_path, p_idx, P).amin(dim=1)                      # [R, N]
    node_row = (torch.arange(R, device=dev)[:, None] * P + node_path) * W + depth
    return _Layout(path_nodes, valid, node_row, node_path, _children(parents, K))


def _children(parents: torch.Tensor, K: int) -> torch.Tensor:
    """parents [R, N] -> children [R, N, K]: each node's children in ascending node index (the
    order siblings are tried in), -1 = none. A child's rank = its earlier siblings."""
    R, N = parents.shape
    par = parents.clamp(min=0)
    nodes = torch.arange(N, device=parents.device)
    same = (par[:, 1:, None] == par[:, None, 1:]) & (nodes[1:, None] > nodes[None, 1:])
    rank = same.sum(dim=2)                                                      # [R, N-1]
    children = torch.full((R, N * K), -1, dtype=torch.int64, device=parents.device)
    children.scatter_(1, par[:, 1:] * K + rank, nodes[1:].expand(R, N - 1).contiguous())
    return children.view(R, N, K)


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


def check_pair(target: GptOssModel, draft: Eagle3Draft) -> None:
    """Draft and target must agree on hidden size, vocab and aux count (ValueError naming the field)."""
    tc, dc = target.config, draft.config
    if draft.target_config.hidden_size != tc.hidden_size or draft.fc.shape[1] % tc.hidden_size:
        raise ValueError(f"{dc.name}: draft target_hidden_size={draft.target_config.hidden_size} (fc input width "
                         f"{draft.fc.shape[1]}) does not match the target's hidden_size={tc.hidden_size}")
    if dc.vocab_size != tc.vocab_size:
        raise ValueError(f"{dc.name}: draft vocab_size={dc.vocab_size} does not match the target's "
                         f"vocab_size={tc.vocab_size}")
    if draft.target_config.num_hidden_layers != tc.num_hidden_layers:
        raise ValueError(f"{dc.name}: draft was bound to a target with num_hidden_layers="
                         f"{draft.target_config.num_hidden_layers}, this target has {tc.num_hidden_layers}")
    if len(draft.boundaries) * tc.hidden_size != draft.fc.shape[1]:
        raise ValueError(f"{dc.name}: aux count {len(draft.boundaries)} (boundaries {draft.boundaries}) x "
                         f"hidden_size {tc.hidden_size} != fc input width {draft.fc.shape[1]}")


# ---------------------------------------------------------------------- the loop
def speculative_generate(target: GptOssModel, draft: Eagle3Draft, requests: Sequence[Request],
                         spec: SpecParams = SpecParams(), *, generator: torch.Generator | None = None,
                         max_context: int | None = None, observer=None, graphs: bool = True) -> list[Result]:
    """Run `requests` to completion with speculative decoding; results in request order.
    `observer` (an engine.trace.Trace, or None) records the run (step r = verify round r).
    `graphs` (internal: tests compare the two): False runs the round's forwards eagerly instead
    of replaying engine.graphs.RoundGraphs' CUDA graphs (the same bits)."""
    _check(target, draft, requests, spec, max_context)
    if not requests:
        return []
    run = _SpecRun.start(target, draft, requests, spec, generator_for(requests, generator), observer, graphs)
    with observing(target, observer):
        prefill(run)
        speculative_decode(run)
    return run.state.results(accept_lengths=run.accept_lengths)


def _check(target: GptOssModel, draft: Eagle3Draft, requests: Sequence[Request], spec: SpecParams,
           max_context: int | None) -> None:
    """The pair, the settings and every request validated before anything runs."""
    if not isinstance(spec, SpecParams):
        raise ValueError(f"speculative_generate: spec must be a SpecParams, got {type(spec).__name__}")
    check_pair(target, draft)
    cfg, dcfg = target.config, draft.config
    if spec.topk > dcfg.draft_vocab_size:
        raise ValueError(f"SpecParams.topk: {spec.topk} exceeds the draft vocabulary ({dcfg.draft_vocab_size})")
    max_context = min(max_context or cfg.max_position_embeddings, dcfg.max_position_embeddings)
    for i, req in enumerate(requests):
        validate_request(req, target, i, max_context)
        total = len(req.prompt) + req.params.max_new_tokens + spec.num_steps
        if total > max_context:
            raise ValueError(f"request {i}: SpecParams.num_steps: prompt ({len(req.prompt)}) + max_new_tokens "
                             f"({req.params.max_new_tokens}) + draft tree depth ({spec.num_steps}) = {total} "
                             f"exceeds the context of {max_context} tokens")
        if spec.verify == "greedy" and not req.params.is_greedy:
            raise ValueError(f"request {i}: SpecParams.verify='greedy' needs greedy requests "
                             f"(temperature 0 or greedy=True)")


class _RoundShape:
    """The fixed shape of a round: P paths of W rows per request in the verify call (a chain:
    one path of N rows; a tree: up to N - 1 leaves, each path as deep as the deepest node)."""

    def __init__(self, spec: SpecParams):
        self.N = spec.draft_token_num
        self.P = 1 if spec.topk == 1 else self.N - 1
        self.W = min(spec.num_steps, self.N - 1) + 1


@dataclass
class _SpecRun:
    """What the rounds of one speculative_generate call share: the pair, the settings, the
    target's KV cache (slot i: request i; then each request's P - 1 scratch slots), the draft's
    committed KV, each request's depth-1 draft inputs (root_logits, root_h: the draft's last
    committed row), and the decoding state (engine.generate.Decoding) with the accept lengths."""
    target: GptOssModel
    draft: Eagle3Draft
    spec: SpecParams
    shape: _RoundShape
    graphs: RoundGraphs                # the target's KV cache, the draft KV and the round's forwards
    root_logits: torch.Tensor          # [n_req, V_draft] fp32
    root_h: torch.Tensor               # [n_req, H_draft] in the draft's storage dtype
    generator: torch.Generator | None
    capacity: int
    state: Decoding
    accept_lengths: list[list[int]]    # per request, per verify round: accepted drafts + 1

    @classmethod
    def start(cls, target, draft, requests, spec, generator, observer=None, graphs: bool = True) -> "_SpecRun":
        """Empty caches for `requests` (nothing run yet); graphs=False: every forward eager."""
        n, dcfg = len(requests), draft.config
        capacity = max(len(r.prompt) + r.params.max_new_tokens + spec.num_steps for r in requests)
        shape = _RoundShape(spec)
        zeros = lambda width, dt: torch.zeros((n, width), dtype=dt, device=draft.device)  # noqa: E731
        scratch = n * spec.topk if draft.cached and spec.topk > 1 else 0     # a tree's beams (_draft_trees)
        return cls(target, draft, spec, shape, round_graphs(target, draft, n * shape.P, n, capacity, scratch, graphs),
                   zeros(dcfg.draft_vocab_size, torch.float32),
                   zeros(dcfg.hidden_size, draft.act), generator, capacity,
                   Decoding(requests, target.config.eos_token_id, observer), [[] for _ in requests])

    @property
    def requests(self) -> list[Request]:
        return self.state.requests

    @property
    def cache(self):
        return self.graphs.cache

    @property
    def dkv(self) -> DraftKV:
        return self.graphs.dkv

    @property
    def observer(self):
        return self.state.observer

    def commit(self, i: int, tokens: list[int], base: int) -> None:
        """Append request i's tokens of this round (their logprobs at rows base, base + 1, ...
        of the last add_logprobs tensor), stopping at a stop id or max_new_tokens."""
        for j, tok in enumerate(tokens):
            self.state.push(i, tok, base + j, step=len(self.accept_lengths[i]))
            if self.state.finish[i] is not None:
                return


def prefill(run: _SpecRun) -> None:
    """One target call over every prompt (like engine.generate), each request's first token from
    its last prompt position, then one draft extend over the prompts (the first depth 1)."""
    requests, state = run.requests, run.state
    rows_tok, rows_pos, rows_slot, last_rows = [], [], [], []
    for i, req in enumerate(requests):
        last_rows.append(len(rows_tok) + len(req.prompt) - 1)
        rows_tok += req.prompt
        rows_pos += list(range(len(req.prompt)))
        rows_slot += [i] * len(req.prompt)
    if run.observer is not None:
        run.observer.rows(rows_slot, [0] * len(rows_slot))  # prefill: step 0, slot i = request i
    out = run.target.forward(torch.tensor(rows_tok), torch.tensor(rows_pos), torch.tensor(rows_slot), run.cache,
                             capture=run.draft.boundaries)
    ext_req, ext_pos, ext_tok, ext_row, ext_last, which = [], [], [], [], [], []
    row = 0
    for i, req in enumerate(requests):
        m = len(req.prompt)
        logits = out.logits[last_rows[i]]
        tok = sample(logits, req.params, req.seed, m - 1, run.generator)
        run.commit(i, [tok], state.add_logprobs(chosen_logprob(logits, tok).reshape(1)))
        if state.finish[i] is None:
            ext_req += [i] * m
            ext_pos += list(range(m))
            ext_tok += (list(req.prompt) + state.tokens[i])[1:m + 1]
            ext_row += list(range(row, row + m))
            ext_last.append(len(ext_req) - 1)
            which.append(i)
        row += m
    if ext_req:
        feats = out.captured.index_select(0, torch.tensor(ext_row, device=out.captured.device))
        _draft_extend(run.draft, run.dkv, run.root_logits, run.root_h, torch.tensor(ext_req), torch.tensor(ext_pos),
                      torch.tensor(ext_tok), feats, torch.tensor(ext_last), torch.tensor(which), run.capacity)


def speculative_decode(run: _SpecRun) -> None:
    """Verify rounds until every request has finished."""
    while True:
        active = run.state.active()
        if not active:
            return
        _round(run, active)


def _draft_extend(draft: Eagle3Draft, dkv: DraftKV, root_logits: torch.Tensor, root_h: torch.Tensor,
                  req: torch.Tensor, pos: torch.Tensor, tok: torch.Tensor, feats: torch.Tensor,
                  last: torch.Tensor, which: torch.Tensor, kv_len: int, forward=None) -> None:
    """Commit rows (request req[t], position pos[t], token x_{pos+1} tok[t], target feature
    feats[t]) to the draft KV in one draft forward; row last[m] (request which[m]'s last
    committed row) gives that request's next depth 1 (root_logits, root_h). `forward`: the
    draft forward to call (default draft.forward; the round's: RoundGraphs.draft_forward)."""
    step = (forward or draft.forward)(tok, pos, draft.combine_aux(feats), dkv, req, commit=True, kv_len=kv_len)
    dev = root_logits.device
    at, which = last.to(dev), which.to(dev)
    root_logits.index_copy_(0, which, step.logits.index_select(0, at))
    root_h.index_copy_(0, which, step.hidden.index_select(0, at))


# ---------------------------------------------------------------------- one round
# A round is four steps over explicit tensors (module docstring, steps 1-4): _round_inputs (the
# host facts, moved to the device), _draft_step, _verify_step and _accept_step (device only: no
# host read), then _read_round (the one host read) and _commit (host bookkeeping, then the KV
# copies and the draft extend). Everything a step needs is in its arguments. The device-only
# pieces (the draft tree, the verify layout, the verify call, a greedy acceptance, the chosen
# logprobs, the draft extend) go through run.graphs (engine.graphs.RoundGraphs): on a GPU each is a
# CUDA graph per shape, captured at its first round and replayed after, with the round's tensors
# copied into its input buffers; what needs the host runs eagerly between them.
@dataclass
class _RoundIn:
    """The host facts of a round for the `active` requests, on the draft's device."""
    active: list[int]
    act: torch.Tensor                  # [R] the requests' indices (= their KV slots)
    r: torch.Tensor                    # [R] root positions: committed length - 1
    max_r: int
    root_tok: torch.Tensor             # [R] the roots: the last committed tokens
    greedy: list[bool]
    rows: _DraftRows


@dataclass
class _Verified:
    """The verify call's outputs, per tree node."""
    lay: _Layout
    tokens: torch.Tensor               # [R, N] the trees' target ids, on the target's device
    path_slot: torch.Tensor            # [R, P] the KV slot of each path
    node_logits: torch.Tensor          # [R, N, V] fp32
    node_feats: torch.Tensor           # [R, N, A] the draft's features of each node


@dataclass
class _Accepted:
    """What the acceptance decided, still on the device (read back by _read_round)."""
    acc_nodes: torch.Tensor            # [R, W] accepted nodes from the root, padded with the last
    last: torch.Tensor                 # [R] the last accepted node
    ints: torch.Tensor                 # [R, 2 + 2W]: count, accepted tokens, bonus, accepted nodes
    sampled: list[int]                 # rows of sampled requests (their final token is drawn on the host)
    weights: torch.Tensor | None       # [Rs, V] float64: the final draw's distribution
    final_coins: torch.Tensor | None   # [Rs]


def _round(run: _SpecRun, active: list[int]) -> None:
    """One round for the `active` requests. All device work is batched over the requests; the
    one host read is _read_round; everything after it on the host is list bookkeeping."""
    rin = _round_inputs(run, active)
    trees = _draft_step(run, rin)
    ver = _verify_step(run, rin, trees)
    acc = _accept_step(run, rin, trees, ver)
    host, finals = _read_round(acc.ints, acc.weights, acc.final_coins)           # the one host read
    _commit(run, rin, ver, acc, host, finals)


def _round_inputs(run: _SpecRun, active: list[int]) -> _RoundIn:
    """The round's host facts on the draft's device: the integers in one copy, the temperatures in
    another (engine.sampling.host_to: pinned, no host sync)."""
    state, requests, ddev = run.state, run.requests, run.draft.device
    r_host = [state.length(i) - 1 for i in active]
    greedy = [requests[i].params.is_greedy for i in active]
    d_sampled = [run.spec.verify == "rejection" and not g for g in greedy]
    seeds = [seed_as_int64(requests[i].seed) if s and requests[i].seed is not None else 0
             for i, s in zip(active, d_sampled)]
    act, r, root_tok, sampled, seeds_t = host_to(ddev, [active, r_host, [state.last(i) for i in active],
                                                        [int(s) for s in d_sampled], seeds])
    temperature = host_to(ddev, [requests[i].params.temperature if s else 1.0 for i, s in zip(active, d_sampled)],
                          torch.float64)
    rows = _DraftRows(sampled.bool(), temperature, seeds_t,
                      [a for a, (i, s) in enumerate(zip(active, d_sampled)) if s and requests[i].seed is None],
                      any(d_sampled))
    return _RoundIn(active, act, r, max(r_host), root_tok, greedy, rows)


def _draft_step(run: _SpecRun, rin: _RoundIn) -> TreeBatch:
    """1. One draft tree per request, from its depth-1 inputs. On the cached path the whole of
    _draft_trees (every draft step, top-k, beam and numbering op) is one replayed graph, unless a
    row draws from the host generator (then each draft forward is one: RoundGraphs.draft_forward)."""
    inputs = (rin.act, rin.r, rin.root_tok, run.root_logits.index_select(0, rin.act),
              run.root_h.index_select(0, rin.act))
    rows = rin.rows
    if run.draft.cached and not rows.unseeded:
        draft, dkv, spec, any_sampled = run.draft, run.dkv, run.spec, rows.any_sampled    # what the key fixes

        def trees_of(slots, r, root_tok, root_logits, root_h, sampled, temperature, seeds):
            return _draft_trees(draft, dkv, slots, r, root_tok, root_logits, root_h,
                                _DraftRows(sampled, temperature, seeds, [], any_sampled), spec, None, kv_len=None)

        trees = run.graphs.replay(("draft trees", spec, any_sampled), trees_of,
                                  inputs + (rows.sampled, rows.temperature, rows.seeds))
    else:
        trees = _draft_trees(run.draft, run.dkv, *inputs, rows, run.spec, run.generator, kv_len=rin.max_r,
                             forward=run.graphs.draft_forward)
    if run.observer is not None:                           # host reads, trace only
        for a, i in enumerate(rin.active):
            t = trees.tree(a)
            run.observer.event(i, len(run.accept_lengths[i]) + 1, "draft.tokens", t.tokens)
            run.observer.event(i, len(run.accept_lengths[i]) + 1, "draft.parents", t.parents)
    return trees


def _verify_step(run: _SpecRun, rin: _RoundIn, trees: TreeBatch) -> _Verified:
    """2. Every root-to-leaf path as a chain in one target call; path 0 in the request's own slot,
    the others in scratch slots that first receive a copy of the request's committed KV."""
    R, P, W, K, cache = len(rin.active), run.shape.P, run.shape.W, run.spec.topk, run.cache
    tdev = cache.k_all.device                             # the target's device
    tokens = trees.tokens.to(tdev)
    act_t, r_t = rin.act.to(tdev), rin.r.to(tdev)
    n_req = run.root_logits.shape[0]
    lay, path_slot, v_tok, v_pos, v_slot = run.graphs.replay(                        # a replayed graph
        ("verify rows", P, W, K, n_req), lambda par, tok, act, r: _verify_rows(par, tok, act, r, P, W, K, n_req),
        (trees.parents.to(tdev), tokens, act_t, r_t))
    if P > 1:                                              # scratch slots start as copies of the request's
        cache.copy_prefix(path_slot[:, 1:].reshape(-1), _each(act_t, P - 1), rin.max_r)
    if run.observer is not None:                           # padding rows serve no request
        valid = lay.valid.reshape(-1).tolist()
        req_of = [i for i in rin.active for _ in range(P * W)]
        run.observer.rows([q if ok else -1 for q, ok in zip(req_of, valid)],
                          [len(run.accept_lengths[q]) + 1 if ok else 0 for q, ok in zip(req_of, valid)])
    vout = run.graphs.verify(v_tok, v_pos, v_slot)                                  # a replayed graph
    node_logits = vout.logits.index_select(0, lay.node_row.reshape(-1)).view(R, run.shape.N, -1)
    node_feats = vout.captured.index_select(0, lay.node_row.reshape(-1)).view(R, run.shape.N, -1)
    return _Verified(lay, tokens, path_slot, node_logits, node_feats)


def _verify_rows(parents: torch.Tensor, tokens: torch.Tensor, act: torch.Tensor, r: torch.Tensor, P: int, W: int,
                 K: int, n_req: int) -> tuple:
    """The verify call's fixed layout (_layout) and rows: -> (layout, path slots [R, P], and the
    rows' tokens, positions and slots [R * P * W]; padding rows: token 0). Device only."""
    R, dev = parents.shape[0], parents.device
    lay = _layout(parents, P, W, K)
    path_slot = torch.cat([act[:, None], n_req + act[:, None] * (P - 1) + torch.arange(P - 1, device=dev)], 1)
    v_tok = torch.where(lay.valid, tokens.gather(1, lay.path_nodes.flatten(1)).view(R, P, W), 0)
    v_pos = (r[:, None, None] + torch.arange(W, device=dev)).expand(R, P, W)
    v_slot = path_slot[:, :, None].expand(R, P, W)
    return lay, path_slot, v_tok.reshape(-1), v_pos.reshape(-1), v_slot.reshape(-1)


def _accept_step(run: _SpecRun, rin: _RoundIn, trees: TreeBatch, ver: _Verified) -> _Accepted:
    """3. The acceptance rule of every request's mode at every node at once, the walk from the
    root, the bonus token, and for sampled requests the final draw's distribution. A round of
    greedy requests only is one replayed graph (device only: no coins, no host list)."""
    N, W = run.shape.N, run.shape.W
    tokens, kids, node_logits = ver.tokens, ver.lay.children, ver.node_logits
    tdev = tokens.device
    sampled = [a for a, g in enumerate(rin.greedy) if not g]
    if not sampled:
        acc_nodes, last, ints = run.graphs.replay(
            ("greedy accept", W), lambda t, k, nl: _accepted(t, _accept_greedy(t, k, torch.argmax(nl, dim=-1)), nl, W),
            (tokens, kids, node_logits))
        return _Accepted(acc_nodes, last, ints, sampled, None, None)
    choice = _accept_greedy(tokens, kids, torch.argmax(node_logits, dim=-1))
    s_idx = host_to(tdev, sampled)
    which = [rin.active[a] for a in sampled]
    p = _target_distributions(node_logits.index_select(0, s_idx), [run.requests[i].params for i in which])
    coins, fin = _coins(run.requests, which, [run.state.length(i) for i in which], N, run.generator, tdev)
    s_tok, s_kids = tokens.index_select(0, s_idx), kids.index_select(0, s_idx)
    q = trees.q.to(tdev).index_select(0, s_idx) if run.spec.verify == "rejection" else None
    if q is not None:
        s_choice = _accept_rejection(s_tok, s_kids, p, q, coins)
    else:
        s_choice = _accept_target_only(s_tok, s_kids, p, coins, run.spec.threshold_single, run.spec.threshold_acc)
    acc_nodes, last, ints = _accepted(tokens, choice.index_copy(0, s_idx, s_choice), node_logits, W)
    weights = _final_draw_weights(p, s_tok, s_kids, last.index_select(0, s_idx), q)   # q None: target-only
    return _Accepted(acc_nodes, last, ints, sampled, weights, fin)


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


def _commit(run: _SpecRun, rin: _RoundIn, ver: _Verified, acc: _Accepted, host: list, finals: list[int]) -> None:
    """4. Append the accepted tokens and the bonus / correction token (host bookkeeping), bring
    the accepted path's target KV into each request's own slot, and extend the draft KV over the
    newly committed positions."""
    R, W, node_logits = len(rin.active), run.shape.W, ver.node_logits
    tdev = node_logits.device
    new_tok = []
    final_of = dict(zip(acc.sampled, finals))
    for a in range(R):
        L, toks = host[a][0], host[a][1:1 + W]
        nxt = final_of.get(a, host[a][1 + W])
        new_tok.append(toks[1:L] + [nxt] + [0] * (W - L))
    new_t = host_to(tdev, new_tok)                      # pinned, no sync: the device may still run
    rows = node_logits.gather(1, acc.acc_nodes[:, :, None].expand(R, W, node_logits.shape[2])).flatten(0, 1)
    lps = run.graphs.replay(("chosen logprobs",), _chosen_logprobs, (rows, new_t.reshape(-1))).clone()   # [R * W]
    # target KV: bring the accepted path's rows into the request's own slot (a no-op copy for path 0)
    act_t, r_t = rin.act.to(tdev), rin.r.to(tdev)
    src = ver.path_slot.gather(1, ver.lay.node_path.gather(1, acc.last[:, None]))[:, 0]
    run.cache.copy_positions(act_t, src, r_t[:, None] + torch.arange(1, W, device=tdev))
    base = run.state.add_logprobs(lps)
    ext_req, ext_last = [], []
    for a, i in enumerate(rin.active):
        L = host[a][0]
        run.accept_lengths[i].append(L)
        if run.observer is not None:
            run.observer.event(i, len(run.accept_lengths[i]), "verify", host[a][2 + W:2 + W + L] + [new_tok[a][L - 1]])
        run.commit(i, new_tok[a][:L], base + a * W)
        if run.state.finish[i] is None:
            ext_req.append(a)
            ext_last.append(L)
    if ext_req:
        _extend_committed(run, rin, ver, acc, new_t, ext_req, ext_last)


def _extend_committed(run: _SpecRun, rin: _RoundIn, ver: _Verified, acc: _Accepted, new_t: torch.Tensor,
                      ext_req: list[int], ext_last: list[int]) -> None:
    """Draft KV: commit the accepted positions r .. r + L - 1 of the rows `ext_req` (fixed W rows
    per request; rows past L write positions no query sees before they are written again)."""
    W, ddev, tdev, node_feats = run.shape.W, run.draft.device, new_t.device, ver.node_feats
    at = host_to(ddev, [k * W + L - 1 for k, L in enumerate(ext_last)])
    e = host_to(tdev, ext_req)
    feats = node_feats.index_select(0, e).gather(1, acc.acc_nodes.index_select(0, e)[:, :, None].expand(
        -1, W, node_feats.shape[2])).flatten(0, 1).to(ddev)
    e_d = e.to(ddev)
    _draft_extend(run.draft, run.dkv, run.root_logits, run.root_h, _each(rin.act.index_select(0, e_d), W),
                  (rin.r.index_select(0, e_d)[:, None] + torch.arange(W, device=ddev)).reshape(-1),
                  new_t.index_select(0, e).reshape(-1).to(ddev), feats,
                  at, rin.act.index_select(0, e_d), kv_len=rin.max_r + W, forward=run.graphs.draft_forward)


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
