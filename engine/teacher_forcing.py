"""Teacher forcing shaped as a prefill: recorded tokens scored in a few wide forwards instead of a
decode step each. D3 (prefill, decode and verify give a position the same logits) makes these
the bits a free run gave; `lockstep replay`'s teacher-forced mode runs through here.

    results = teacher_force(model, requests, tokens, chunk=256, group=8)   # Result.logprobs per request

engine.generate.score is the step-by-step form, which also gives the model's own choice and its
margin at each step (the calibrated judge of other engines uses it).
"""

from __future__ import annotations

import torch

from lockstep.engine.generate import observing
from lockstep.engine.request import Request, Result


def teacher_force(model, reqs: list[Request], forced: list[list[int]], chunk: int = 256, group: int = 8,
                  trace=None) -> list[Result]:
    """Each request's `forced` tokens scored: its prompt and tokens go through the model's forward
    in chunks of `chunk` positions (`group` requests per forward), and token k's logprob is read
    from the logits of position prompt + k - 1. D3 makes these the bits of the decode steps (the
    tests hold it). `trace` (an observer: an engine OpTrace or a replay's step log) is told each
    row's request and step as generate tells it."""
    with observing(model, trace):
        return _prefill_shaped(model, reqs, forced, chunk, group, trace)


def _prefill_shaped(model, reqs, forced, chunk: int, group: int, trace):
    # host index tensors, a slice per member per forward (a 64 x 1024 replay has 67,520 positions:
    # built one by one in Python they cost ~0.1 s)
    seqs = [torch.tensor(list(r.prompt) + list(t[:-1]), dtype=torch.int64) for r, t in zip(reqs, forced)]
    targets = [torch.tensor(t, dtype=torch.int64) for t in forced]
    out = [torch.empty(len(t), dtype=torch.float32) for t in forced]
    dev = model.device
    for g0 in range(0, len(reqs), group):
        members = list(range(g0, min(g0 + group, len(reqs))))
        longest = max(len(seqs[i]) for i in members)
        cache = model.new_cache(len(members), longest)
        for start in range(0, longest, chunk):
            tok, pos, slot, owners, steps, logit_rows, wanted, spans = [], [], [], [], [], [], [], []
            n = 0                                                    # rows so far in this forward
            for s_, i in enumerate(members):
                end = min(start + chunk, len(seqs[i]))
                if end <= start:
                    continue
                p0 = len(reqs[i].prompt) - 1                         # the position whose logits give token 0
                p = torch.arange(start, end)
                tok.append(seqs[i][start:end])
                pos.append(p)
                slot.append(torch.full((end - start,), s_))
                owners.append(torch.full((end - start,), i))
                steps.append((p - p0).clamp(min=0))
                lo = max(start, p0)                                  # the rows that score a token
                if lo < end:
                    logit_rows.append(torch.arange(n + lo - start, n + end - start))
                    wanted.append(targets[i][lo - p0:end - p0])
                    spans.append((i, lo - p0, end - p0))
                n += end - start
            if not tok:
                continue
            if trace is not None:
                trace.rows(torch.cat(owners).tolist(), torch.cat(steps).tolist())
            rows = torch.cat(logit_rows) if logit_rows else torch.zeros(0, dtype=torch.int64)
            res = model.forward(torch.cat(tok).to(dev), torch.cat(pos).to(dev), torch.cat(slot).to(dev), cache,
                                logit_rows=rows.to(dev))
            if not spans:
                continue
            chosen = chosen_logprobs(model.ops.sampler, res.logits, torch.cat(wanted).to(dev)).cpu()   # [rows] fp32
            r0 = 0
            for i, k0, k1 in spans:
                out[i][k0:k1] = chosen[r0:r0 + k1 - k0]
                r0 += k1 - k0
    return [Result(list(t), lp, "length") for t, lp in zip(forced, out)]


ROWS_AT_ONCE = 1024        # logits rows per log_softmax: bounds its float64 temporaries (~1.6 GB at V = 201k)


def chosen_logprobs(sampler, logits, tokens):
    """sampler.chosen_logprobs [R, V], [R] -> [R] float32, a block of rows at a time (the
    same bits: no row of it sees another). One call per block instead of one per row is what
    keeps a 64 x 1024 replay from being launch-bound on a GPU."""
    out = [sampler.chosen_logprobs(logits[r0:r0 + ROWS_AT_ONCE], tokens[r0:r0 + ROWS_AT_ONCE].to(torch.int64))
           for r0 in range(0, logits.shape[0], ROWS_AT_ONCE)]
    return torch.cat(out) if out else logits.new_empty(0, dtype=torch.float32)
