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
The parts live beside this module: engine.spec_tree (SpecParams, trees, the verify layout),
engine.spec_draft (drafting), engine.spec_accept (the acceptance rules), engine.spec_round (a round).

One round (spec_round._round: _round_inputs, _draft_step, _verify_step, _accept_step, _read_round,
_commit), for every unfinished request at once: each step below is a few batched
device calls over all requests (no per-request Python, no host read), up to the round's one
host read (_read_round, step 3); a row is computed alone, so a request's result does not
depend on its batchmates:

  1. Draft (engine.eagle3; spec_draft._draft_trees). Depth 1 comes from the draft's last committed row
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
  2. Verify (target; spec_tree._layout). Every root-to-leaf path of the tree runs as a chain at the real
     positions n-1 .. n-1+depth: path 0 in the request's own KV slot, every other path in a
     scratch slot whose first n-1 positions first receive a copy of the request's slot (one
     copy over all layers: KVCache.copy_prefix). The call has a fixed shape, P paths of W rows
     per request (a chain: one path of N rows); rows past a path's leaf are padding that write
     only positions no query reads before they are written again. A node's logits are then
     computed exactly as in sequential decoding (same keys, same order; DESIGN D3), so greedy
     speculative decoding reproduces engine.generate bit for bit, logprobs included.
  3. Accept (engine.spec_accept): the rules exist once, batched over every node of every tree at once
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

A round samples only through the target model's `ops.sampler`, as engine.generate does: its
target distributions (spec_accept._target_distributions) and its chosen logprobs.

The first output token comes from the prefill logits through the same sampler (Gumbel at
position prompt_len - 1), exactly as in engine.generate. Logprobs: log_softmax of the raw fp32
target logits at the chosen token. Accept length of a round = accepted draft tokens + 1.
"""


from __future__ import annotations

from typing import Sequence

import torch

from lockstep.engine.eagle3 import Eagle3Draft
from lockstep.engine.generate import generator_for, observing, validate_request
from lockstep.engine.model import GptOssModel
from lockstep.engine.request import Request, Result
from lockstep.engine.sampling import host_to, row_settings
# The public names of the round's parts, importable from here as before the split.
from lockstep.engine.spec_accept import (inverse_cdf, inverse_cdf_rows, target_probs,  # noqa: F401
                                         verify_greedy, verify_rejection, verify_target_only)
from lockstep.engine.spec_draft import _draft_extend, draft_top_k  # noqa: F401
from lockstep.engine.spec_round import _round, _SpecRun
from lockstep.engine.spec_tree import VERIFY_MODES, SpecParams, Tree, TreeBatch, number_tree  # noqa: F401


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


def speculative_generate(target: GptOssModel, draft: Eagle3Draft, requests: Sequence[Request],
                         spec: SpecParams = SpecParams(), *, generator: torch.Generator | None = None,
                         max_context: int | None = None, observer=None, graphs: bool = True) -> list[Result]:
    """Run `requests` to completion with speculative decoding; results in request order.
    `observer` (an engine.trace.OpTrace, or None) records the run (step r = verify round r).
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
    dev = out.logits.device
    first, first_lp = run.target.ops.sampler.sample(
        out.logits.index_select(0, host_to(dev, last_rows)),
        row_settings([r.params for r in requests], [r.seed for r in requests], dev),
        host_to(dev, [len(r.prompt) - 1 for r in requests]), run.generator)
    ext_req, ext_pos, ext_tok, ext_row, ext_last, which = [], [], [], [], [], []
    row = 0
    for i, (req, tok) in enumerate(zip(requests, first.tolist())):
        m = len(req.prompt)
        run.commit(i, [tok], state.add_logprobs(first_lp[i:i + 1]))
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
