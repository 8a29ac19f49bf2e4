"""Speculative decoding with an EAGLE3 draft: chain and tree drafting, three verify modes (DESIGN §6).

    results = speculative_generate(target, draft, [Request(...), ...], SpecParams(topk=2, num_steps=3,
                                                                                  draft_token_num=6))

State of a request between rounds: its committed tokens x_0 .. x_{n-1} (prompt plus output; x_{n-1},
the root, has not been through the target yet). The target's KV cache holds positions 0 .. n-2 and
the draft's committed KV holds positions 0 .. n-2 (always computed from target features: the draft
step at position t sees the target feature h_t and the embedding of x_{t+1}).

One round, for every unfinished request (all rows of all requests share each forward call;
every row is computed alone, so a request's result does not depend on its batchmates):

  1. Draft (engine.eagle3). Depth 1 comes from the draft's last committed row (position n-2).
     Each further step expands the current beams: a beam node at depth d runs a draft step at
     position n-2+d over the committed draft keys, its tree ancestors' keys and its own. Tree
     (topk > 1): every beam's top-k children are candidates (score = sum of draft log-probs,
     float64), the best topk of them become the next beams; after num_steps depths the best
     draft_token_num - 1 candidates (score descending, creation order on ties; a parent always
     precedes its child) form the tree, numbered in creation order; node 0 is the root.
     Deterministic top-k drafting (lowest draft id on ties) for `greedy` and `target-only`;
     `rejection` samples each draft token from q = softmax(draft logits / temperature) with
     Gumbel-max on its own stream: murmur(seed, pos, DRAFT_COLUMNS + draft id), pos = the
     sequence position of the proposed token.
  2. Verify (target). Every root-to-leaf path of the tree runs as a chain at the real positions
     n-1 .. n-1+depth: path 0 in the request's own KV slot, every other path in a scratch slot
     that first receives a copy of the request's slot. A node's logits are then computed exactly
     as in sequential decoding (same keys, same order; DESIGN D3), so greedy speculative decoding
     reproduces engine.generate bit for bit, logprobs included.
  3. Accept (pure functions below, one per mode), coins from kernels.coins.verify_coins(seed, n, N)
     (n = committed length, root included) or, without a seed, from the explicit generator.
  4. Commit: the accepted tokens and the bonus/correction token are appended (stopping at a stop
     id or max_new_tokens, as engine.generate does). Target KV: if the accepted path did not run in
     the request's own slot, its positions are copied back; the rejected rows are never read again
     (rollback = they are overwritten before any query can see them). Draft KV: tree rows were never
     written; a draft extend over the newly committed positions (target features from the verify
     rows) writes them and yields the next round's depth 1.

The first output token comes from the prefill logits through engine.sampling.sample (Gumbel at
position prompt_len - 1), exactly as in engine.generate. Logprobs: log_softmax of the raw fp32
target logits at the chosen token. Accept length of a round = accepted draft tokens + 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from engine.eagle3 import DraftKV, Eagle3Draft
from engine.generate import Request, validate_request
from engine.model import GptOssModel
from engine.small_ops import top_k_lowest_index
from engine.sampling import SamplingParams, chosen_logprob, keep_mask, sample, seed_as_int64
from kernels import portable
from kernels.coins import COIN_MAX, DRAFT_COLUMNS, gumbel_from_hash, gumbel_noise, verify_coins

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


@dataclass
class SpecResult:
    tokens: list[int]                 # generated ids (stop token included if hit)
    logprobs: torch.Tensor            # [len(tokens)] float32, as engine.generate
    finish_reason: str                # "stop" or "length"
    accept_lengths: list[int] = field(default_factory=list)   # per verify round: accepted drafts + 1

    @property
    def logprob_bytes(self) -> bytes:
        return self.logprobs.numpy().tobytes()

    @property
    def mean_accept_length(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 0.0


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


# ---------------------------------------------------------------------- verify (pure)
def inverse_cdf(weights: torch.Tensor, coin: float) -> int:
    """First index whose running sum (float64, left to right: portable.running_sum) exceeds coin * total, among ids with
    non-zero weight (DESIGN §5). total is the running sum's last value, so coin < 1 always lands.
    A coin outside [0, 1) is refused (an unclamped float32 coin of 1.0 would walk past the CDF)."""
    if not 0.0 <= float(coin) < 1.0:
        raise ValueError(f"inverse_cdf: coin must be in [0, 1), got {float(coin)!r}")
    w = weights.to(torch.float64).clamp(min=0)
    cs = portable.running_sum(w)
    target = float(coin) * float(cs[-1])
    hit = ((cs > target) & (w > 0)).nonzero()
    if hit.numel():
        return int(hit[0, 0])
    nz = (w > 0).nonzero()
    if not nz.numel():
        raise ValueError("inverse_cdf: all weights are zero")
    return int(nz[-1, 0])


def verify_greedy(tree: Tree, argmax: Sequence[int]) -> tuple[list[int], int]:
    """argmax[i]: target argmax at node i. -> (accepted nodes incl. root, bonus token)."""
    cur, accepted = 0, [0]
    while True:
        nxt = next((c for c in tree.children(cur) if tree.tokens[c] == argmax[cur]), None)
        if nxt is None:
            return accepted, int(argmax[cur])
        cur = nxt
        accepted.append(cur)


def verify_target_only(tree: Tree, p: torch.Tensor, coins: torch.Tensor, final_coin: float,
                       threshold_single: float = 1.0, threshold_acc: float = 1.0) -> tuple[list[int], int]:
    """DESIGN §6 target-only. p [N, V]: target sampling distribution at each node (float64).
    coins [N]: node i's children are tried with coins[i]; final_coin draws the last token.
    A zero-probability child is never accepted (it is no inverse-CDF outcome either)."""
    cur, accepted = 0, [0]
    while True:
        kids = tree.children(cur)
        if not kids:                                   # every depth accepted: bonus from full p
            return accepted, inverse_cdf(p[cur], final_coin)
        u = float(coins[cur])
        acc = 0.0
        chosen = None
        for c in kids:
            pc = float(p[cur, tree.tokens[c]])
            acc += pc
            if pc > 0 and (u <= acc / threshold_acc or pc >= threshold_single):
                chosen = c
                break
        if chosen is None:                             # remove the rejected children's mass
            residual = p[cur].clone()
            residual[[tree.tokens[c] for c in kids]] = 0
            if not bool((residual > 0).any()):
                residual = p[cur]                      # nothing left: fall back to the full p
            return accepted, inverse_cdf(residual, final_coin)
        cur = chosen
        accepted.append(cur)


def verify_rejection(tree: Tree, p: torch.Tensor, coins: torch.Tensor, final_coin: float
                     ) -> tuple[list[int], int]:
    """Leviathan et al. on a chain: node i (drawn from q_i = tree.q[i]) is accepted iff
    coins[parent] * q_i(x) < p_parent(x); on rejection draw from normalize(max(p - q_i, 0)) with
    final_coin; if all accepted, the bonus comes from p at the last node."""
    cur, accepted = 0, [0]
    while True:
        kids = tree.children(cur)
        if not kids:
            return accepted, inverse_cdf(p[cur], final_coin)
        if len(kids) != 1:
            raise ValueError("verify_rejection: the tree must be a chain (topk=1)")
        c = kids[0]
        x = tree.tokens[c]
        q = tree.q[c]
        if float(coins[cur]) * float(q[x]) < float(p[cur, x]):
            cur = c
            accepted.append(c)
            continue
        residual = (p[cur] - q).clamp(min=0)
        if not bool((residual > 0).any()):
            residual = p[cur]
        return accepted, inverse_cdf(residual, final_coin)


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The target's sampling distribution (float64): temperature, then top-k/top-p/min-p masks,
    renormalized (the same masks as engine.sampling)."""
    z = logits.to(torch.float64) / params.temperature
    keep = keep_mask(z, params.top_k, params.top_p, params.min_p)
    return portable.softmax(torch.where(keep, z, float("-inf")), dim=-1)


# ---------------------------------------------------------------------- drafting helpers
@dataclass
class _Cand:
    draft_id: int
    token: int                      # target id
    parent: int                     # candidate index, -1 = root
    depth: int
    score: float
    h_in: torch.Tensor              # the parent's draft output (this node's h input)
    q: torch.Tensor | None = None   # rejection: q over the target vocab that drew this node
    k: torch.Tensor | None = None   # this node's draft key/value, once it has run a step
    v: torch.Tensor | None = None


def draft_top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic drafting: the k most likely draft ids of one node's draft logits [V_draft], by
    log-prob (float64) descending, equal log-probs by the lower draft id -> (log-probs [k], ids [k])."""
    logp = portable.log_softmax(logits.to(torch.float64), dim=-1)
    return top_k_lowest_index(logp, k)


def _draft_children(draft: Eagle3Draft, logits: torch.Tensor, params: SamplingParams, topk: int,
                    sampled: bool, seed: int | None, pos: int, generator: torch.Generator | None
                    ) -> list[tuple[int, float, torch.Tensor | None]]:
    """-> [(draft id, log-prob, q over target vocab or None)] for one node's draft logits [V_draft]."""
    if not sampled:
        vals, ids = draft_top_k(logits, topk)
        return [(int(i), float(v), None) for v, i in zip(vals, ids)]
    Vd = logits.shape[-1]
    z = logits.to(torch.float64) / params.temperature
    logq = portable.log_softmax(z, dim=-1)
    if seed is not None:
        dev = logits.device
        g = gumbel_noise(torch.tensor([seed_as_int64(seed)], device=dev), torch.tensor([pos], device=dev),
                         DRAFT_COLUMNS + torch.arange(Vd, dtype=torch.int64, device=dev))[0]
    else:
        h = torch.randint(0, 1 << 32, (Vd,), dtype=torch.int64, generator=generator)
        g = gumbel_from_hash(h.to(logits.device))
    d = int(torch.argmax(logq + g))
    q = torch.zeros(draft.config.vocab_size, dtype=torch.float64, device=logits.device)
    q[draft.hot_ids] = portable.exp(logq)
    return [(d, float(logq[d]), q)]


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
                         max_context: int | None = None) -> list[SpecResult]:
    """Run `requests` to completion with speculative decoding; results in request order."""
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
    if not requests:
        return []
    if generator is None and any(r.seed is None and not r.params.is_greedy for r in requests):
        generator = torch.Generator()
        generator.seed()                                   # explicit, not reproducible

    n_req = len(requests)
    N = spec.draft_token_num
    max_paths = N - 1
    scratch0 = n_req
    capacity = max(len(r.prompt) + r.params.max_new_tokens + spec.num_steps for r in requests)
    cache = target.new_cache(n_req + n_req * (max_paths - 1) + 1, capacity)
    dkv = DraftKV(dcfg, n_req, capacity, device=draft.device)
    bounds = draft.boundaries
    stop_ids = [set(r.params.stop_token_ids if r.params.stop_token_ids is not None else cfg.eos_token_id)
                for r in requests]
    seqs = [list(r.prompt) for r in requests]
    out_tok: list[list[int]] = [[] for _ in requests]
    out_lp: list[list[torch.Tensor]] = [[] for _ in requests]
    finish: list[str | None] = [None] * n_req
    accept_lengths: list[list[int]] = [[] for _ in requests]
    root_logits: list[torch.Tensor | None] = [None] * n_req    # draft logits of the last committed row
    root_h: list[torch.Tensor | None] = [None] * n_req         # draft output of the last committed row

    trace = getattr(target, "trace", None)                 # engine.trace, or None: nothing recorded

    def emit(i: int, tok: int, logits_row: torch.Tensor) -> None:
        if trace is not None:                              # step: 0 = prefill, r = verify round r
            trace.event(i, len(accept_lengths[i]), "sampling.token", tok)
            trace.event(i, len(accept_lengths[i]), "sampling.logprob", chosen_logprob(logits_row, tok))
        seqs[i].append(tok)
        out_tok[i].append(tok)
        out_lp[i].append(chosen_logprob(logits_row, tok))
        if tok in stop_ids[i]:
            finish[i] = "stop"
        elif len(out_tok[i]) >= requests[i].params.max_new_tokens:
            finish[i] = "length"

    def draft_extend(rows: list[tuple[int, int, int, torch.Tensor]]) -> None:
        """rows (request, position t, token x_{t+1}, target feature h_t): commit to the draft KV."""
        if not rows:
            return
        feats = torch.stack([r[3] for r in rows])
        step = draft.forward(torch.tensor([r[2] for r in rows]), torch.tensor([r[1] for r in rows]),
                             draft.combine_aux(feats), dkv, torch.tensor([r[0] for r in rows]), commit=True)
        for j, (i, _, _, _) in enumerate(rows):
            root_logits[i], root_h[i] = step.logits[j], step.hidden[j]      # the last row per request wins

    # ---- prefill (one call, like engine.generate) and the first token
    rows_tok, rows_pos, rows_slot, last_rows = [], [], [], []
    for i, req in enumerate(requests):
        last_rows.append(len(rows_tok) + len(req.prompt) - 1)
        rows_tok += req.prompt
        rows_pos += list(range(len(req.prompt)))
        rows_slot += [i] * len(req.prompt)
    if trace is not None:
        trace.rows(rows_slot, [0] * len(rows_slot))         # prefill: step 0, slot i = request i
    out = target.forward(torch.tensor(rows_tok), torch.tensor(rows_pos), torch.tensor(rows_slot), cache,
                         capture=bounds)
    ext = []
    row = 0
    for i, req in enumerate(requests):
        m = len(req.prompt)
        logits = out.logits[last_rows[i]]
        emit(i, sample(logits, req.params, req.seed, m - 1, generator), logits)
        if finish[i] is None:
            ext += [(i, t, seqs[i][t + 1], out.captured[row + t]) for t in range(m)]
        row += m
    draft_extend(ext)

    # ---- rounds
    while True:
        active = [i for i in range(n_req) if finish[i] is None]
        if not active:
            break
        trees = _draft_trees(draft, dkv, requests, active, seqs, root_logits, root_h, spec, generator)

        # verify: every root-to-leaf path as a chain; path 0 in the request's slot
        rows_tok, rows_pos, rows_slot, rows_req = [], [], [], []
        where: dict[int, dict[int, int]] = {}          # request -> node -> first row
        path_slot: dict[int, list[tuple[list[int], int]]] = {}
        for a, i in enumerate(active):
            tree = trees[i]
            r = len(seqs[i]) - 1
            where[i] = {}
            path_slot[i] = []
            for j, path in enumerate(tree.paths()):
                slot = i if j == 0 else scratch0 + i * (max_paths - 1) + (j - 1)
                if j:
                    for layer in range(cfg.num_hidden_layers):
                        cache.k[layer][slot] = cache.k[layer][i]
                        cache.v[layer][slot] = cache.v[layer][i]
                path_slot[i].append((path, slot))
                for node in path:
                    where[i].setdefault(node, len(rows_tok))
                    rows_tok.append(tree.tokens[node])
                    rows_pos.append(r + tree.depth(node))
                    rows_slot.append(slot)
                    rows_req.append(i)
        if trace is not None:                          # verify round r of request i is its step r
            for i in active:
                trace.event(i, len(accept_lengths[i]) + 1, "draft.tokens", trees[i].tokens)
                trace.event(i, len(accept_lengths[i]) + 1, "draft.parents", trees[i].parents)
            trace.rows(rows_req, [len(accept_lengths[i]) + 1 for i in rows_req])
        vout = target.forward(torch.tensor(rows_tok), torch.tensor(rows_pos), torch.tensor(rows_slot), cache,
                              capture=bounds)

        # coins: seeded requests by hash at n = committed length, others from the generator
        coins: dict[int, tuple[torch.Tensor, float]] = {}
        seeded = [i for i in active if requests[i].seed is not None and not requests[i].params.is_greedy]
        if seeded:
            dev = vout.logits.device
            c, f = verify_coins(torch.tensor([seed_as_int64(requests[i].seed) for i in seeded], device=dev),
                                torch.tensor([len(seqs[i]) for i in seeded], device=dev), N)
            for k, i in enumerate(seeded):
                coins[i] = (c[k], float(f[k]))
        for i in active:
            if i not in coins and not requests[i].params.is_greedy:
                u = torch.rand(N + 1, generator=generator, dtype=torch.float32).clamp(max=COIN_MAX)
                coins[i] = (u[:N], float(u[N]))

        ext = []
        for i in active:
            tree, params = trees[i], requests[i].params
            n_nodes = len(tree.tokens)
            node_logits = [vout.logits[where[i][node]] for node in range(n_nodes)]
            if params.is_greedy:
                accepted, nxt = verify_greedy(tree, [int(torch.argmax(lg)) for lg in node_logits])
            else:
                p = torch.stack([target_probs(lg, params) for lg in node_logits])
                u, fin = coins[i]
                if spec.verify == "rejection":
                    accepted, nxt = verify_rejection(tree, p, u, fin)
                else:
                    accepted, nxt = verify_target_only(tree, p, u, fin, spec.threshold_single, spec.threshold_acc)
            accept_lengths[i].append(len(accepted))
            if trace is not None:
                trace.event(i, len(accept_lengths[i]), "verify", accepted + [nxt])
            r = len(seqs[i]) - 1
            # target KV: bring the accepted path's rows into the request's own slot
            last = accepted[-1]
            path, slot = next((ps for ps in path_slot[i] if last in ps[0]))
            if slot != i and len(accepted) > 1:
                lo, hi = r + 1, r + len(accepted)
                for layer in range(cfg.num_hidden_layers):
                    cache.k[layer][i, :, lo:hi] = cache.k[layer][slot, :, lo:hi]
                    cache.v[layer][i, :, lo:hi] = cache.v[layer][slot, :, lo:hi]
            new_tokens = [tree.tokens[a] for a in accepted[1:]] + [nxt]
            for j, tok in enumerate(new_tokens):
                emit(i, tok, node_logits[accepted[j]])
                if finish[i] is not None:
                    break
            if finish[i] is None:
                ext += [(i, r + j, new_tokens[j], vout.captured[where[i][a]]) for j, a in enumerate(accepted)]
        draft_extend(ext)

    return [SpecResult(tokens=out_tok[i], logprobs=torch.stack(out_lp[i]).to("cpu", torch.float32),
                       finish_reason=finish[i], accept_lengths=accept_lengths[i]) for i in range(n_req)]


def _draft_trees(draft: Eagle3Draft, dkv: DraftKV, requests, active, seqs, root_logits, root_h,
                 spec: SpecParams, generator) -> dict[int, Tree]:
    """Build one draft tree per active request (see the module docstring, step 1)."""
    sampled = {i: spec.verify == "rejection" and not requests[i].params.is_greedy for i in active}
    cands: dict[int, list[_Cand]] = {i: [] for i in active}
    beams: dict[int, list[int]] = {}
    for i in active:
        r = len(seqs[i]) - 1
        for d, lp, q in _draft_children(draft, root_logits[i], requests[i].params, spec.topk, sampled[i],
                                        requests[i].seed, r + 1, generator):
            cands[i].append(_Cand(d, int(draft.hot_ids[d]), -1, 1, lp, root_h[i], q))
        beams[i] = list(range(len(cands[i])))
    for _ in range(2, spec.num_steps + 1):
        rows = [(i, b) for i in active for b in beams[i]]
        toks, pos, hid, slots, prefix, anc = [], [], [], [], [], []
        for i, b in rows:
            c = cands[i][b]
            r = len(seqs[i]) - 1
            toks.append(c.token)
            pos.append(r + c.depth - 1)
            hid.append(c.h_in)
            slots.append(i)
            prefix.append(r)
            chain, a = [], c.parent
            while a >= 0:
                chain.append((cands[i][a].k, cands[i][a].v))
                a = cands[i][a].parent
            anc.append(chain[::-1])
        step = draft.forward(torch.tensor(toks), torch.tensor(pos), torch.stack(hid), dkv, torch.tensor(slots),
                             commit=False, prefix_lens=prefix, ancestors=anc)
        new_beams: dict[int, list[int]] = {i: [] for i in active}
        for row, (i, b) in enumerate(rows):
            c = cands[i][b]
            c.k, c.v = step.k[row], step.v[row]
            r = len(seqs[i]) - 1
            for d, lp, q in _draft_children(draft, step.logits[row], requests[i].params, spec.topk, sampled[i],
                                            requests[i].seed, r + c.depth + 1, generator):
                cands[i].append(_Cand(d, int(draft.hot_ids[d]), b, c.depth + 1, c.score + lp, step.hidden[row], q))
                new_beams[i].append(len(cands[i]) - 1)
        for i in active:
            fresh = new_beams[i]
            fresh.sort(key=lambda k: (-cands[i][k].score, k))
            beams[i] = sorted(fresh[:spec.topk])
    trees = {}
    for i in active:
        cs = cands[i]
        order = sorted(range(len(cs)), key=lambda k: (-cs[k].score, k))[:spec.draft_token_num - 1]
        order.sort()
        node_of = {k: j + 1 for j, k in enumerate(order)}
        tokens = [seqs[i][-1]] + [cs[k].token for k in order]
        parents = [-1] + [0 if cs[k].parent < 0 else node_of[cs[k].parent] for k in order]
        qs = [None] + [cs[k].q for k in order]
        trees[i] = Tree(tokens, parents, qs)
    return trees
