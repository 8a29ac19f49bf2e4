"""Generation: requests in, tokens, logprobs and captured states out.

    results = generate(model, [Request(prompt=[...], params=SamplingParams(...), seed=7), ...])

The loop, as small named steps over one `_Run`:
  1. validate every request (`_check`; a ValueError names the bad field; nothing runs if one is bad);
  2. `prefill`: give each request a KV-cache slot, and prefill all prompts together, optionally
     in chunks of `prefill_chunk` tokens (chunk j of every prompt in one forward call);
  3. `take` each request's first token from its last prompt position, then `decode_n_tokens`:
     each `decode_one_token` feeds every unfinished request's last token, in groups of at most
     `max_batch`, each group padded up to a power-of-two bucket with rows on a scratch slot
     (static shapes);
  4. a request stops when it takes one of its stop ids (the EOS list by default; the stop
     token is kept in the output) or reaches max_new_tokens (`Decoding.push`).

`Decoding` is the decoding state (tokens, finish reasons, logprob rows, the stop rule) that
engine.speculative shares. The hooks are arguments, never state on the model: the token
source (`Sampled`, the product's; `Forced`, teacher forcing for harness.replay), the
`observer` (an engine.trace.OpTrace, attached to the model for the call only) and `prefix_cache`.

The step is the product's fast path: on a GPU each decode step replays one captured CUDA graph
per bucket (engine.graphs.decode_steps; the eager forward when states are captured or a trace
records, and on the CPU), its inputs go to the device in one copy without a sync, the whole
group is sampled on the device at once (the model's `ops.sampler`: row for row the bits of
engine.sampling.sample, and on a GPU the tokens and their logprobs from one fused launch; replayed
from a captured engine.graphs.SampleGraph unless a row draws from the host generator), and the
step's one host read is the sampled tokens, from which the stop flags follow. Logprobs stay on
the device until the end (tests/engine/test_generate_host_reads.py). A seeded group in one batch
runs ahead: the next step is launched from these ids on the device before they are read
(`decode_n_tokens`), so the GPU never waits on the host between steps.

Because every row of the model is computed by the same operations whatever its batch
(engine/model.py, kernels/portable.py), a request's tokens,
logprobs and captured states do not depend on the other requests, their order, the batch
size, the bucket padding, or the prefill chunking (DESIGN §2, D2/D3).

Captured states: with `capture=[b0, b1, ...]`, Result.captured is [n, len(capture) * H]: row
p is the concatenated boundary states of position p, for every position that went through
the model: the prompt and every generated token except the last (n = prompt + generated - 1).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Sequence

import torch

from lockstep.engine.graphs import DecodeSteps, capturable, decode_steps
from lockstep.engine.model import ONE_DEVICE, GptOssModel
from lockstep.engine.request import Request, Result, SamplingParams, check_request  # noqa: F401  (the request type)
from lockstep.engine.sampling import Sampler, decision_scores, host_to, row_settings


# ---------------------------------------------------------------------- the decoding state
class Decoding:
    """Every request's decoding state, shared by plain and speculative generation: its tokens so
    far, its finish reason, the stop rule, and where each token's logprob sits among the device
    tensors handed to `add_logprobs` (joined and read back once, by `results`). `observer` (an
    engine.trace.OpTrace, or None) is told each committed token and its logprob."""

    def __init__(self, requests: Sequence[Request], eos: Sequence[int], observer=None):
        self.requests, self.observer = list(requests), observer
        self.stop = [r.stop_ids(eos) for r in requests]
        self.tokens: list[list[int]] = [[] for _ in requests]
        self.finish: list[str | None] = [None] * len(requests)
        self._parts: list[torch.Tensor] = []               # 1-D fp32 device tensors, in order
        self._rows = 0                                     # rows in _parts so far
        self._row_of: list[list[int]] = [[] for _ in requests]   # each token's row in torch.cat(_parts)

    def active(self) -> list[int]:
        return [i for i, f in enumerate(self.finish) if f is None]

    def open_after_next(self, i: int) -> bool:
        """Request i is unfinished and its next token will not reach max_new_tokens (only a stop
        id among it could end it): the step after the next one has a row for it."""
        return self.finish[i] is None and len(self.tokens[i]) + 1 < self.requests[i].params.max_new_tokens

    def length(self, i: int) -> int:
        """Committed length of request i: prompt plus generated tokens."""
        return len(self.requests[i].prompt) + len(self.tokens[i])

    def last(self, i: int) -> int:
        return self.tokens[i][-1] if self.tokens[i] else self.requests[i].prompt[-1]

    def add_logprobs(self, lps: torch.Tensor) -> int:
        """Keep a 1-D device tensor of logprobs; -> the row of its first entry."""
        self._parts.append(lps)
        self._rows += lps.shape[0]
        return self._rows - lps.shape[0]

    def push(self, i: int, tok: int, row: int, step: int) -> None:
        """Commit token `tok` of request i, its logprob at `row` (of the last add_logprobs tensor);
        `step` is the observer's step number of the decision (engine.trace)."""
        if self.observer is not None:
            last = self._parts[-1]
            self.observer.event(i, step, "sampling.token", tok)
            self.observer.event(i, step, "sampling.logprob", last[row - (self._rows - last.shape[0])])
        self.tokens[i].append(tok)
        self._row_of[i].append(row)
        if tok in self.stop[i]:
            self.finish[i] = "stop"
        elif len(self.tokens[i]) >= self.requests[i].params.max_new_tokens:
            self.finish[i] = "length"

    def results(self, captured: list | None = None, accept_lengths: list | None = None) -> list[Result]:
        """One Result per request; the logprobs come to the host in one copy."""
        lp = torch.cat(self._parts).to("cpu", torch.float32) if self._parts else None
        return [Result(tokens=self.tokens[i], logprobs=lp[torch.tensor(self._row_of[i], dtype=torch.int64)],
                       finish_reason=self.finish[i],
                       captured=torch.stack(captured[i]).cpu() if captured is not None else None,
                       accept_lengths=accept_lengths[i] if accept_lengths is not None else None)
                for i in range(len(self.requests))]


# ---------------------------------------------------------------------- token sources
class Sampled:
    """The product's token source: every row sampled on the device by the model's sampler (or a
    captured SampleGraph when the decode step hands one in); logprobs of the chosen ids."""
    forced = False

    def __init__(self, requests: Sequence[Request], generator: torch.Generator | None):
        self.requests, self.generator = requests, generator

    def graph(self, steps: DecodeSteps, group: list[int]):
        """A captured sampler for this group, or None: rows without a seed draw on the host."""
        seeds = [self.requests[i].seed for i in group]
        params = [self.requests[i].params for i in group]
        if all(s is not None or p.is_greedy for s, p in zip(seeds, params)):
            return steps.sampler(params, seeds)
        return None

    def choose(self, owners: list[int], logits: torch.Tensor, positions: list[int], state: Decoding,
               sampler: Sampler, graph=None, positions_dev: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (chosen ids [R], their logprobs [R] fp32), both on the device."""
        if graph is not None:
            chosen, lps = graph(logits, positions_dev)
            return chosen, lps.clone()                     # the graph's buffer is reused next step
        settings = row_settings([self.requests[i].params for i in owners], [self.requests[i].seed for i in owners],
                                logits.device)
        return sampler.sample(logits, settings, host_to(logits.device, positions), self.generator)


class Forced:
    """Teacher forcing (harness.replay): request i's k-th token is tokens[i][k] instead of a
    sample; the logprob is still the chosen token's."""
    forced = True

    def __init__(self, tokens: Sequence[Sequence[int]]):
        self.tokens = tokens

    def check(self, requests: Sequence[Request]) -> None:
        if len(self.tokens) != len(requests) or any(
                len(f) < r.params.max_new_tokens for f, r in zip(self.tokens, requests)):
            raise ValueError("generate: forced needs one token list per request, each at least max_new_tokens long")

    def graph(self, steps, group):
        return None

    def choose(self, owners, logits, positions, state: Decoding, sampler: Sampler, graph=None, positions_dev=None):
        chosen = host_to(logits.device, [self.tokens[i][len(state.tokens[i])] for i in owners])
        return chosen, sampler.chosen_logprobs(logits, chosen)


class Scoring(Forced):
    """Teacher forcing that also keeps, per step, the token this engine would have chosen there
    (`choice`) and how close that choice was (`margin`: top-1 minus top-2 of
    engine.sampling.decision_scores): what a judge of another engine's tokens needs; with
    `keep_logits`, also each step's raw logits (on the CPU) and the position they are drawn at."""

    def __init__(self, tokens: Sequence[Sequence[int]], requests: Sequence[Request], keep_logits: bool = False):
        super().__init__(tokens)
        self.requests = requests
        self.choice: list[list[int]] = [[] for _ in tokens]
        self.margin: list[list[float]] = [[] for _ in tokens]
        self.logits: list[list[torch.Tensor]] | None = [[] for _ in tokens] if keep_logits else None
        self.positions: list[list[int]] = [[] for _ in tokens]

    def choose(self, owners, logits, positions, state: Decoding, sampler: Sampler, graph=None, positions_dev=None):
        settings = row_settings([self.requests[i].params for i in owners], [self.requests[i].seed for i in owners],
                                logits.device)
        top = decision_scores(logits, settings, host_to(logits.device, positions)).topk(2, dim=-1)
        for row, i in enumerate(owners):
            self.choice[i].append(int(top.indices[row, 0]))
            self.margin[i].append(float(top.values[row, 0] - top.values[row, 1]))
            self.positions[i].append(int(positions[row]))
            if self.logits is not None:
                self.logits[i].append(logits[row].to(torch.float32).cpu())
        return super().choose(owners, logits, positions, state, sampler)


@dataclass
class Scored:
    """One request's given tokens, scored teacher-forced: their logprobs (the bits generate gives
    for the same tokens), the engine's own choice at each step and that choice's margin."""
    tokens: list[int]
    logprobs: torch.Tensor            # [n] float32
    choice: list[int]
    margin: list[float]
    finish_reason: str
    positions: list[int] = field(default_factory=list)   # the position each step's draw is keyed by
    logits: torch.Tensor | None = None                  # [n, V] fp32 raw logits per step (keep_logits)


def score(model: GptOssModel, requests: Sequence[Request], tokens: Sequence[Sequence[int]],
          keep_logits: bool = False) -> list[Scored]:
    """Feed each request's `tokens` back through the model (teacher forcing, D3: the logits of
    every position are the free run's) and score them; a request stops where its tokens end, or
    earlier where one of them is a stop id (the stop rule of generate). keep_logits: each step's
    raw logits too (what another engine's sampler can be run on)."""
    import dataclasses

    cut = [dataclasses.replace(r, params=dataclasses.replace(r.params, max_new_tokens=max(1, len(t))))
           for r, t in zip(requests, tokens)]
    padded = [list(t) or [0] for t in tokens]
    source = Scoring(padded, cut, keep_logits)
    results = generate(model, cut, forced=padded, source=source)
    out = []
    for i, r in enumerate(results):
        n = len(r.tokens)
        kept = torch.stack(source.logits[i][:n]) if source.logits is not None and n else None
        out.append(Scored(r.tokens, r.logprobs, source.choice[i][:n], source.margin[i][:n], r.finish_reason,
                          source.positions[i][:n], kept))
    return out


# ---------------------------------------------------------------------- one run
@dataclass
class _Run:
    """What the steps of one generate() call share."""
    model: GptOssModel
    requests: Sequence[Request]
    state: Decoding
    source: Sampled | Forced
    steps: DecodeSteps
    capture: tuple[int, ...]
    max_batch: int
    eager: bool                                            # the eager forward instead of the graphs
    captured: list[list[torch.Tensor]] = field(default_factory=list)

    @property
    def observer(self):
        return self.state.observer

    def keep_captured(self, owners: list[int], out) -> None:
        if self.capture:
            for row, i in enumerate(owners):
                self.captured[i].append(out.captured[row])


def generate(model: GptOssModel, requests: Sequence[Request], *, capture: Sequence[int] = (),
             max_batch: int = 8, prefill_chunk: int | None = None,
             generator: torch.Generator | None = None, max_context: int | None = None,
             forced: Sequence[Sequence[int]] | None = None, prefix_cache=None, observer=None,
             source: "Forced | None" = None) -> list[Result]:
    """Run `requests` to completion; results in request order (see the module docstring).
    Hooks for harness.replay, each passed in: `forced[i]` teacher-forces request i (a Forced
    token source); `prefix_cache` (an engine.prefix_cache.PrefixCache) reuses cached
    prompt-prefix KV before the prefill; `observer` (an engine.trace.OpTrace) records the run."""
    source = source or (Forced(forced) if forced is not None else None)
    _check(model, requests, capture, max_batch, prefill_chunk, max_context, source, prefix_cache)
    if not requests:
        return []
    source = source or Sampled(requests, generator_for(requests, generator))
    eager = bool(capture) or observer is not None or not capturable(model)
    steps = decode_steps(model, len(requests) + 1, max(len(r.prompt) + r.params.max_new_tokens for r in requests))
    run = _Run(model, requests, Decoding(requests, model.config.eos_token_id, observer), source, steps,
               tuple(capture), max_batch, eager, [[] for _ in requests])
    with observing(model, observer):
        prefill(run, prefill_chunk, prefix_cache)
        decode_n_tokens(run)
    return run.state.results(run.captured if capture else None)


def _check(model, requests, capture, max_batch, prefill_chunk, max_context, source, prefix_cache) -> None:
    """Every argument and request validated before anything runs (a ValueError names the field)."""
    if max_batch < 1:
        raise ValueError(f"generate: max_batch must be >= 1, got {max_batch}")
    if prefill_chunk is not None and prefill_chunk < 1:
        raise ValueError(f"generate: prefill_chunk must be >= 1, got {prefill_chunk}")
    max_context = max_context or model.config.max_position_embeddings
    for i, req in enumerate(requests):
        validate_request(req, model, i, max_context)
    if source is not None:
        source.check(requests)
    if prefix_cache is not None and capture:
        raise ValueError("generate: capture and prefix_cache cannot be combined (a hit computes no states)")


def validate_request(req: Request, model: GptOssModel, index: int, max_context: int) -> None:
    """lockstep.engine.request.check_request against this model's vocabulary."""
    check_request(req, model.config.vocab_size, index, max_context)


def generator_for(requests: Sequence[Request], generator: torch.Generator | None) -> torch.Generator | None:
    """The explicit generator unseeded sampled rows draw from: the caller's, else a fresh one."""
    if generator is None and any(r.seed is None and not r.params.is_greedy for r in requests):
        generator = torch.Generator()
        generator.seed()                                   # explicit, but not reproducible
    return generator


@contextmanager
def observing(model, observer):
    """The model's forward records into `observer` for the duration (nothing changes without one)."""
    if observer is None:
        yield
        return
    before, model.trace = model.trace, observer
    try:
        yield
    finally:
        model.trace = before


# ---------------------------------------------------------------------- the steps
def take(run: _Run, owners: list[int], logits: torch.Tensor, positions: list[int], graph=None,
         positions_dev: torch.Tensor | None = None) -> None:
    """Row k of logits [R, V] is request owners[k]'s input at positions[k]: choose every row's
    token at once on the device, then read the tokens back (the call's one host read) and commit."""
    state = run.state
    chosen, lps = run.source.choose(owners, logits, positions, state, run.model.ops.sampler, graph, positions_dev)
    chosen_host = chosen.tolist()                          # the host read
    base = state.add_logprobs(lps)
    for k, (i, tok) in enumerate(zip(owners, chosen_host)):
        state.push(i, tok, base + k, step=len(state.tokens[i]))   # step = the index of the token chosen


def prefill(run: _Run, prefill_chunk: int | None, prefix_cache=None) -> None:
    """Chunk j of every prompt in one forward call (positions a prefix-cache hit supplied are
    skipped); the last prompt position of each request gives its first token."""
    requests, cache = run.requests, run.steps.cache
    longest = max(len(r.prompt) for r in requests)
    cached = [prefix_cache.lookup(r.prompt, cache, i) if prefix_cache is not None else 0
              for i, r in enumerate(requests)]
    for start in range(0, longest, prefill_chunk or longest):
        rows = _prefill_rows(requests, start, prefill_chunk or longest, cached)
        if rows is None:
            continue
        tok, pos, owners, last_rows = rows
        if run.observer is not None:
            run.observer.rows(owners, [0] * len(owners))   # the prefill is step 0
        dev = run.model.device
        out = run.model.forward(host_to(dev, tok), host_to(dev, pos), host_to(dev, owners), cache,
                                capture=run.capture, logit_rows=host_to(dev, [r for _, r in last_rows]))
        run.keep_captured(owners, out)
        if last_rows:
            take(run, [i for i, _ in last_rows], out.logits, [len(requests[i].prompt) - 1 for i, _ in last_rows])
    if prefix_cache is not None:
        for i, req in enumerate(requests):
            prefix_cache.store(req.prompt, cache, i)


def _prefill_rows(requests, start: int, chunk: int, cached: list[int]):
    """The rows of prefill chunk [start, start + chunk): (tokens, positions, owners = slots,
    [(request, row) of each last prompt position]), or None when every row is cached."""
    tok, pos, owners, last_rows = [], [], [], []
    for i, req in enumerate(requests):
        for j, t in enumerate(req.prompt[start:start + chunk]):
            if start + j < cached[i]:
                continue
            if start + j == len(req.prompt) - 1:
                last_rows.append((i, len(tok)))
            tok.append(t)
            pos.append(start + j)
            owners.append(i)
    return (tok, pos, owners, last_rows) if tok else None


def decode_n_tokens(run: _Run) -> None:
    """Decode until every request has finished: each step feeds every unfinished request's last
    token, in groups of at most max_batch. Where the group can run ahead (`_runs_ahead`), step s + 1
    is launched from step s's ids on the device before step s's ids are read back, so the GPU never
    idles on that read; a row that step s stops has its row of step s + 1 dropped (D2: no other
    row's bits depend on it)."""
    pending = None                                         # a launched step not yet read back
    while True:
        if pending is not None:
            follow = [i for i in pending.group if run.state.open_after_next(i)]
            launched = launch_step(run, follow, after=pending) if follow else None
            commit_step(run, pending)
            pending = launched
            continue
        active = run.state.active()
        if not active:
            return
        if _runs_ahead(run, active):
            pending = launch_step(run, active)
            continue
        for g in range(0, len(active), run.max_batch):
            decode_one_token(run, active[g:g + run.max_batch])


def _runs_ahead(run: _Run, active: list[int]) -> bool:
    """One group, sampled on the device with seeds (a host generator's draws, a forced token, a
    trace or captured states need the committed state of every step) on one device."""
    return (run.observer is None and not run.capture and run.model.comm is ONE_DEVICE
            and isinstance(run.source, Sampled) and len(active) <= run.max_batch
            and run.source.graph(run.steps, active) is not None)


@dataclass
class _Launched:
    """A decode step on its way: its rows, their positions, the chosen ids and logprobs on the
    device, and the ids' copy to the host (on a GPU pinned and non-blocking, `ready` when done)."""
    group: list[int]
    positions: list[int]
    chosen: torch.Tensor
    logprobs: torch.Tensor
    host: torch.Tensor
    ready: "torch.cuda.Event | None"


def launch_step(run: _Run, group: list[int], after: _Launched | None = None) -> _Launched:
    """Launch one decode step for `group` without reading anything back: its tokens are the
    committed last tokens, or `after`'s chosen ids gathered on the device."""
    state, dev = run.state, run.model.device
    n = len(group)
    pad = _bucket(n, run.max_batch) - n
    scratch = len(run.requests)                            # the slot of the padding rows
    if after is None:
        pos = [state.length(i) - 1 for i in group]
        first = [state.last(i) for i in group] + [0] * pad
    else:
        row = {i: k for k, i in enumerate(after.group)}
        pos = [after.positions[row[i]] + 1 for i in group]
        first = [row[i] for i in group] + [len(after.group)] * pad     # rows of after's ids; the pad's 0
    inputs = host_to(dev, [first, pos + [0] * pad, group + [scratch] * pad])   # one copy, no sync
    tokens = inputs[0] if after is None else torch.cat([after.chosen, after.chosen.new_zeros(1)])[inputs[0]]
    logits = run.steps(tokens, inputs[1], inputs[2])[:n]
    chosen, lps = run.source.choose(group, logits, pos, state, run.model.ops.sampler,
                                    run.source.graph(run.steps, group), inputs[1][:n])
    chosen = chosen.clone()                                # the next step's sampling rewrites the graph's
    if dev.type != "cuda":
        return _Launched(group, pos, chosen, lps, chosen, None)
    host = torch.empty(chosen.shape, dtype=chosen.dtype, pin_memory=True)
    host.copy_(chosen, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return _Launched(group, pos, chosen, lps, host, ready)


def commit_step(run: _Run, step: _Launched) -> None:
    """Wait for a launched step's ids (its one host read) and commit them; a row whose previous
    step stopped it is dropped."""
    if step.ready is not None:
        step.ready.synchronize()
    state = run.state
    base = state.add_logprobs(step.logprobs)
    for k, (i, tok) in enumerate(zip(step.group, step.host.tolist())):
        if state.finish[i] is None:
            state.push(i, tok, base + k, step=len(state.tokens[i]))


def decode_one_token(run: _Run, group: list[int]) -> None:
    """One decode step for `group`, padded up to a power-of-two bucket with rows on the scratch
    slot: its inputs in one copy without a sync, then a captured graph (or the eager forward)."""
    state = run.state
    pad = _bucket(len(group), run.max_batch) - len(group)
    pos = [state.length(i) - 1 for i in group]
    if run.observer is not None:                           # decode step s samples token s
        run.observer.rows(group + [-1] * pad, [len(state.tokens[i]) for i in group] + [-1] * pad)
    scratch = len(run.requests)                            # the slot of the padding rows
    inputs = host_to(run.model.device, [[state.last(i) for i in group] + [0] * pad, pos + [0] * pad,
                                        group + [scratch] * pad])                # one copy, no sync
    if run.eager:
        out = run.model.forward(inputs[0], inputs[1], inputs[2], run.steps.cache, capture=run.capture)
        run.keep_captured(group, out)
        take(run, group, out.logits[:len(group)], pos)
        return
    logits = run.steps(inputs[0], inputs[1], inputs[2])
    take(run, group, logits[:len(group)], pos, run.source.graph(run.steps, group), inputs[1][:len(group)])


def _bucket(n: int, max_batch: int) -> int:
    b = 1
    while b < n:
        b *= 2
    return min(b, max(max_batch, n))
