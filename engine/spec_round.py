"""One verify round of speculative decoding over every unfinished request at once (steps 1-4 of
engine.speculative's docstring), and the state the rounds of one run share (_SpecRun)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lockstep.engine.eagle3 import DraftKV, Eagle3Draft
from lockstep.engine.generate import Decoding
from lockstep.engine.graphs import RoundGraphs, round_graphs
from lockstep.engine.model import GptOssModel
from lockstep.engine.request import Request, seed_as_int64
from lockstep.engine.sampling import host_to
from lockstep.engine.spec_accept import (_accept_greedy, _accept_rejection, _accept_target_only, _accepted,
                                         _coins, _final_draw_weights, _read_round,
                                         _target_distributions)
from lockstep.engine.spec_draft import _draft_extend, _draft_trees, _DraftRows
from lockstep.engine.spec_tree import SpecParams, TreeBatch, _each, _layout, _Layout


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
    p = _target_distributions(run.target.ops.sampler, node_logits.index_select(0, s_idx),
                              [run.requests[i].params for i in which])
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
    lps = run.graphs.replay(("chosen logprobs",), run.target.ops.sampler.chosen_logprobs,
                            (rows, new_t.reshape(-1))).clone()                                       # [R * W]
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
