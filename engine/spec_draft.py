"""Drafting a round's trees with the EAGLE3 head (DESIGN §6, step 1 of engine.speculative's round):
deterministic top-k children (lowest draft id on ties) or, in rejection mode, Gumbel-max draws
from q on the DRAFT_COLUMNS stream; beams expanded depth by depth; the draft KV extended over
newly committed positions."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lockstep.engine.eagle3 import DraftKV, Eagle3Draft
from lockstep.engine.request import SamplingParams, seed_as_int64
from lockstep.engine.spec_tree import SpecParams, TreeBatch, _best, _each, number_tree
from lockstep.kernels import portable
from lockstep.kernels.coins import DRAFT_COLUMNS, gumbel_from_hash, gumbel_noise
from lockstep.kernels.moe_router import top_k_lowest_index


def draft_top_k(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic drafting: the k most likely draft ids of draft logits [..., V_draft], by
    log-prob (float64) descending, equal log-probs by the lower draft id -> (log-probs, ids) [..., k]."""
    logp = portable.log_softmax(logits.to(torch.float64), dim=-1)
    return top_k_lowest_index(logp, k)


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
