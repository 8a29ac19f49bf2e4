"""Generation: requests in, tokens, logprobs and captured states out.

    results = generate(model, [Request(prompt=[...], params=SamplingParams(...), seed=7), ...])

The loop:
  1. validate every request (a ValueError names the bad field; nothing runs if one is bad);
  2. give each request a KV-cache slot, and prefill all prompts together, optionally in
     chunks of `prefill_chunk` tokens (chunk j of every prompt in one forward call);
  3. sample each request's first token from its last prompt position, then decode: each step
     feeds every unfinished request's last token, in groups of at most `max_batch`, each
     group padded up to a power-of-two bucket with rows on a scratch slot (static shapes);
  4. a request stops when it samples one of its stop ids (the EOS list by default; the stop
     token is kept in the output) or reaches max_new_tokens.

The step is the product's fast path: on a GPU each decode step replays one captured CUDA graph
per bucket (engine.graphs.decode_steps; the eager forward when states are captured or a trace
records, and on the CPU), its inputs go to the device in one copy without a sync, the whole
group is sampled on the device at once (engine.sampling.sample_rows: row for row the bits of
`sample`; on a GPU replayed from a captured engine.graphs.SampleGraph unless a row draws from
the host generator), and the step's one host read is the sampled tokens, from which the stop
flags follow. Logprobs stay on the device until the end (tests/engine/test_generate_host_reads.py).

Because every row of the model is computed by the same operations whatever its batch
(engine/model.py, kernels/portable.py), a request's tokens,
logprobs and captured states do not depend on the other requests, their order, the batch
size, the bucket padding, or the prefill chunking (DESIGN §2, D2/D3).

Captured states: with `capture=[b0, b1, ...]`, Result.captured is [n, len(capture) * H]: row
p is the concatenated boundary states of position p, for every position that went through
the model: the prompt and every generated token except the last (n = prompt + generated - 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from engine.graphs import decode_steps
from engine.model import ONE_DEVICE, GptOssModel
from engine.sampling import SamplingParams, chosen_logprobs, host_to, sample_rows, seed_as_int64


@dataclass
class Request:
    prompt: Sequence[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None

    def __post_init__(self):
        if isinstance(self.prompt, torch.Tensor):
            self.prompt = self.prompt.tolist()
        if not isinstance(self.prompt, (list, tuple)):
            raise ValueError(f"Request.prompt: must be a list of token ids, got {type(self.prompt).__name__}")
        self.prompt = list(self.prompt)
        if not self.prompt:
            raise ValueError("Request.prompt: must not be empty")
        for i, t in enumerate(self.prompt):
            if isinstance(t, bool) or not isinstance(t, int):
                raise ValueError(f"Request.prompt: token at index {i} is not an int: {t!r}")
        if not isinstance(self.params, SamplingParams):
            raise ValueError(f"Request.params: must be a SamplingParams, got {type(self.params).__name__}")
        if self.seed is not None:
            seed_as_int64(self.seed)


@dataclass
class Result:
    tokens: list[int]               # generated ids (the stop token included, if one was hit)
    logprobs: torch.Tensor          # [len(tokens)] float32: log_softmax(raw logits)[token]
    finish_reason: str              # "stop" or "length"
    captured: torch.Tensor | None   # [prompt + len(tokens) - 1, len(capture) * H] or None


def validate_request(req: Request, model: GptOssModel, index: int, max_context: int) -> None:
    V = model.config.vocab_size
    where = f"request {index}: "
    for i, t in enumerate(req.prompt):
        if not 0 <= t < V:
            raise ValueError(f"{where}Request.prompt: token id {t} at index {i} is outside [0, vocab_size={V})")
    total = len(req.prompt) + req.params.max_new_tokens
    if total > max_context:
        raise ValueError(f"{where}SamplingParams.max_new_tokens: prompt ({len(req.prompt)}) + max_new_tokens "
                         f"({req.params.max_new_tokens}) = {total} exceeds the context of {max_context} tokens")
    for t in req.params.stop_token_ids or ():
        if t >= V:
            raise ValueError(f"{where}SamplingParams.stop_token_ids: id {t} is outside [0, vocab_size={V})")


def _bucket(n: int, max_batch: int) -> int:
    b = 1
    while b < n:
        b *= 2
    return min(b, max(max_batch, n))


def generate(model: GptOssModel, requests: Sequence[Request], *, capture: Sequence[int] = (),
             max_batch: int = 8, prefill_chunk: int | None = None,
             generator: torch.Generator | None = None, max_context: int | None = None,
             forced: Sequence[Sequence[int]] | None = None, prefix_cache=None) -> list[Result]:
    """Run `requests` to completion; results in request order (see the module docstring).
    Optional hooks for harness.replay: `forced[i]` teacher-forces request i (its k-th token is
    forced[i][k] instead of a sample; the logprob is still the chosen token's); `prefix_cache`
    (an engine.prefix_cache.PrefixCache) reuses cached prompt-prefix KV before the prefill."""
    cfg = model.config
    if max_batch < 1:
        raise ValueError(f"generate: max_batch must be >= 1, got {max_batch}")
    if prefill_chunk is not None and prefill_chunk < 1:
        raise ValueError(f"generate: prefill_chunk must be >= 1, got {prefill_chunk}")
    max_context = max_context or cfg.max_position_embeddings
    for i, req in enumerate(requests):
        validate_request(req, model, i, max_context)
    if forced is not None and (len(forced) != len(requests) or any(
            len(f) < r.params.max_new_tokens for f, r in zip(forced, requests))):
        raise ValueError("generate: forced needs one token list per request, each at least max_new_tokens long")
    if prefix_cache is not None and capture:
        raise ValueError("generate: capture and prefix_cache cannot be combined (a hit computes no states)")
    if not requests:
        return []
    if generator is None and any(r.seed is None and not r.params.is_greedy for r in requests):
        generator = torch.Generator()
        generator.seed()                                   # explicit, but not reproducible

    n = len(requests)
    scratch = n                                            # slot for bucket padding rows
    trace = getattr(model, "trace", None)                  # engine.trace, or None: nothing recorded
    eager = bool(capture) or trace is not None or not _capturable(model)
    steps = decode_steps(model, n + 1, max(len(r.prompt) + r.params.max_new_tokens for r in requests))
    cache = steps.cache
    stop_ids = [set(r.params.stop_token_ids if r.params.stop_token_ids is not None else cfg.eos_token_id)
                for r in requests]
    tokens: list[list[int]] = [[] for _ in requests]
    logprobs: list[torch.Tensor] = []                      # per sampling call: [R] fp32, on the device
    n_logprobs = 0                                         # rows in logprobs so far
    logprob_at: list[list[int]] = [[] for _ in requests]   # each token's row in torch.cat(logprobs)
    captured: list[list[torch.Tensor]] = [[] for _ in requests]
    finish: list[str | None] = [None] * n

    def take(owners: list[int], logits: torch.Tensor, positions: list[int], sampler=None,
             positions_dev: torch.Tensor | None = None) -> None:
        """Row k of logits [R, V] is request owners[k]'s input at positions[k]: sample every
        row at once on the device (through `sampler`, a captured engine.graphs.SampleGraph,
        when given), then read the tokens back: the call's one host read."""
        nonlocal n_logprobs
        params = [requests[i].params for i in owners]
        if forced is not None:
            chosen = host_to(logits.device, [forced[i][len(tokens[i])] for i in owners])
            lps = chosen_logprobs(logits, chosen)
        elif sampler is not None:
            chosen, lps = sampler(logits, positions_dev)
            lps = lps.clone()                              # the graph's buffer is reused next step
        else:
            chosen = sample_rows(logits, params, [requests[i].seed for i in owners], positions, generator)
            lps = chosen_logprobs(logits, chosen)
        chosen_host = chosen.tolist()                      # the host read
        for k, (i, tok) in enumerate(zip(owners, chosen_host)):
            if trace is not None:                          # step = the index of the token sampled
                trace.event(i, len(tokens[i]), "sampling.token", tok)
                trace.event(i, len(tokens[i]), "sampling.logprob", lps[k])
            tokens[i].append(tok)
            logprob_at[i].append(n_logprobs + k)
            if tok in stop_ids[i]:
                finish[i] = "stop"
            elif len(tokens[i]) >= params[k].max_new_tokens:
                finish[i] = "length"
        logprobs.append(lps)
        n_logprobs += len(owners)

    # ---- prefill: chunk j of every prompt goes into one forward call
    longest = max(len(r.prompt) for r in requests)
    chunk = prefill_chunk or longest
    cached = [prefix_cache.lookup(r.prompt, cache, i) if prefix_cache is not None else 0
              for i, r in enumerate(requests)]               # positions whose KV a cache hit supplied
    for start in range(0, longest, chunk):
        rows_tok, rows_pos, rows_slot, owners, last_rows = [], [], [], [], []
        for i, req in enumerate(requests):
            piece = req.prompt[start:start + chunk]
            for j, t in enumerate(piece):
                if start + j < cached[i]:
                    continue
                if start + j == len(req.prompt) - 1:
                    last_rows.append((i, len(rows_tok)))
                rows_tok.append(t)
                rows_pos.append(start + j)
                rows_slot.append(i)
                owners.append(i)
        if not rows_tok:
            continue
        if trace is not None:
            trace.rows(owners, [0] * len(owners))           # the prefill is step 0
        dev = model.device
        out = model.forward(host_to(dev, rows_tok), host_to(dev, rows_pos), host_to(dev, rows_slot), cache,
                            capture=capture, logit_rows=host_to(dev, [r for _, r in last_rows]))
        if capture:
            for row, i in enumerate(owners):
                captured[i].append(out.captured[row])
        if last_rows:
            take([i for i, _ in last_rows], out.logits, [len(requests[i].prompt) - 1 for i, _ in last_rows])

    if prefix_cache is not None:
        for i, req in enumerate(requests):
            prefix_cache.store(req.prompt, cache, i)

    # ---- decode: one step per group, through a captured graph on a GPU (engine.graphs)
    while True:
        active = [i for i in range(n) if finish[i] is None]
        if not active:
            break
        for g in range(0, len(active), max_batch):
            group = active[g:g + max_batch]
            size = _bucket(len(group), max_batch)
            pad = size - len(group)
            pos = [len(requests[i].prompt) + len(tokens[i]) - 1 for i in group]
            if trace is not None:                          # decode step s samples token s
                trace.rows(group + [-1] * pad, [len(tokens[i]) for i in group] + [-1] * pad)
            inputs = host_to(model.device, [[tokens[i][-1] for i in group] + [0] * pad, pos + [0] * pad,
                                            group + [scratch] * pad])            # one copy, no sync
            if eager:
                out = model.forward(inputs[0], inputs[1], inputs[2], cache, capture=capture)
                logits = out.logits
                if capture:
                    for row, i in enumerate(group):
                        captured[i].append(out.captured[row])
                take(group, logits[:len(group)], pos)
                continue
            logits = steps(inputs[0], inputs[1], inputs[2])
            seeds = [requests[i].seed for i in group]
            params = [requests[i].params for i in group]
            sampler = None
            if forced is None and all(s is not None or p.is_greedy for s, p in zip(seeds, params)):
                sampler = steps.sampler(params, seeds)     # unseeded rows draw on the host: eager
            take(group, logits[:len(group)], pos, sampler, inputs[1][:len(group)])

    lp_host = torch.cat(logprobs).to("cpu", torch.float32) if logprobs else None
    return [Result(tokens=tokens[i],
                   logprobs=lp_host[torch.tensor(logprob_at[i], dtype=torch.int64)],
                   finish_reason=finish[i],
                   captured=torch.stack(captured[i]).cpu() if capture else None)
            for i in range(n)]


def _capturable(model) -> bool:
    """Decode steps replay a CUDA graph on a GPU, except on a sharded model (its expert-parallel
    torch path reads routed ids on the host, and collectives are not captured here)."""
    return model.device.type == "cuda" and model.comm is ONE_DEVICE
