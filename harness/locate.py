"""The first-divergence locator: where two runs that must agree part, down to the op.

Two levels, both reported with harness.compare's tensor report:

1. From the results alone (free): the first request, step and token whose bits differ, by the
   tokens, logprob bytes, captured states and accept lengths of each request. The earliest step
   wins (then the lowest request index): a step's inputs are the earlier steps' outputs, so the
   earliest difference is the one that can explain the others. Step 0 is the prefill; step s is
   the decode step that samples token s (plain generation) or verify round s (speculative).

2. By re-running (costs one run of each side): both sides run again with an engine.trace.OpTrace
   that keeps that request's rows of that step, every op of the forward recorded (a topology
   gathers each sharded op to its one-device layout), and the loop's decisions (sampled token,
   draft tree, verify outcome). The first boundary that differs names the layer; the first op
   that differs, in the order the forward runs them, names the op. If every op of the forward
   agrees, the divergence is in what the loop did with the logits (sampling, draft, verify), or
   it came from an earlier step's KV-cache writes that no output showed.

   When the first op that differs is an attention (its inputs, this step's q, k and v, are equal),
   it may only be reading what an earlier step wrote into the KV cache: an earlier step can part
   inside (a norm, a projection) while its own token and logprob round to the same bits. Each
   side then runs once more, op-traced at every earlier step (at most MAX_EARLIER of them), and
   the report names the earliest whose op trace differs and its first op, or says that none does.

A golden keeps level 1's inputs (tokens, logprobs, captured states, accept lengths), not the
ops, and the code that recorded it cannot be re-run, so a golden mismatch is located at level 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from lockstep.harness.compare import TensorDiff, diff_tensor
from lockstep.engine.trace import OPS, OpTrace, op_of


@dataclass
class RequestBits:
    """What one request's result pins: generated tokens, their logprobs, captured boundary states
    (one row per position that went through the model) and accept lengths (speculative)."""
    prompt_len: int
    tokens: list[int]
    logprobs: torch.Tensor
    captured: torch.Tensor | None = None
    accept_lengths: list[int] | None = None

    @classmethod
    def of(cls, result, prompt_len: int) -> "RequestBits":
        """From an engine.request.Result (plain or speculative)."""
        return cls(prompt_len, list(result.tokens), result.logprobs, getattr(result, "captured", None),
                   getattr(result, "accept_lengths", None))

    @classmethod
    def from_tensors(cls, tensors: dict, i: int, prompt_len: int) -> "RequestBits":
        """From a generate spec's result or golden tensors (tokens_i, logprobs_i, ...)."""
        acc = tensors.get(f"accept_lengths_{i}")
        return cls(prompt_len, tensors[f"tokens_{i}"].tolist(), tensors[f"logprobs_{i}"],
                   tensors.get(f"captured_{i}"), None if acc is None else acc.tolist())

    def step_of(self, token: int) -> int:
        """The step that produced generated token `token` (see the module docstring)."""
        if self.accept_lengths is None or token == 0:
            return token
        emitted = 1
        for r, n in enumerate(self.accept_lengths, 1):
            emitted += n
            if token < emitted:
                return r
        return len(self.accept_lengths) + 1

    def first_token_of(self, step: int) -> int:
        if self.accept_lengths is None or step == 0:
            return step
        return 1 + sum(self.accept_lengths[:step - 1])


def _first_unequal(a, b) -> int | None:
    """The first index along dim 0 where a and b (lists, or tensors compared bit for bit) differ;
    where one is a prefix of the other, the shorter one's length; None if equal."""
    n = min(len(a), len(b))
    if isinstance(a, torch.Tensor) and n:
        x, y = a[:n].contiguous(), b[:n].contiguous()
        x, y = x.view(torch.uint8).reshape(n, -1), y.view(torch.uint8).reshape(n, -1)
        rows = (x != y).any(-1).nonzero()
        if rows.numel():
            return int(rows[0, 0])
    elif not isinstance(a, torch.Tensor):
        for j in range(n):
            if a[j] != b[j]:
                return j
    return None if len(a) == len(b) else n


@dataclass
class Divergence:
    """Level 1: where request `request` first differs."""
    request: int
    step: int
    token: int                       # index among the generated tokens
    position: int                    # its sequence position (prompt length + token)
    speculative: bool
    what: list[str]                  # which of tokens / logprobs / captured / accept lengths differ there
    diffs: list[TensorDiff] = field(default_factory=list)   # the request's whole tensors

    def step_name(self) -> str:
        if self.step == 0:
            return "step 0 (the prefill)"
        return f"{'verify round' if self.speculative else 'decode step'} {self.step}"


def first_divergence(reference: Sequence[RequestBits], other: Sequence[RequestBits],
                     sides: tuple[str, str] = ("golden", "this run")) -> Divergence | None:
    """Level 1 over every request: the earliest differing step, then the lowest request index."""
    found = []
    for i, (a, b) in enumerate(zip(reference, other)):
        candidates = []                                              # (step, token, what)
        j = _first_unequal(a.tokens, b.tokens)
        if j is not None:
            candidates.append((a.step_of(j), j, "tokens"))
        j = _first_unequal(a.logprobs, b.logprobs)
        if j is not None:
            candidates.append((a.step_of(j), j, "logprob bits"))
        if a.captured is not None and b.captured is not None:
            p = _first_unequal(a.captured, b.captured)
            if p is not None:                       # row p is position p, computed by the step
                j = max(0, p - a.prompt_len + 1)    # that samples token p - prompt_len + 1
                candidates.append((a.step_of(j), j, "captured states"))
        if a.accept_lengths is not None and b.accept_lengths is not None:
            r = _first_unequal(a.accept_lengths, b.accept_lengths)
            if r is not None:
                candidates.append((r + 1, a.first_token_of(r + 1), "accept lengths"))
        if candidates:
            step, token = min(c[:2] for c in candidates)
            what = [c[2] for c in candidates if c[:2] == (step, token)]
            found.append((step, i, token, what))
    if not found:
        return None
    step, i, token, what = min(found)
    a, b = reference[i], other[i]
    d = Divergence(i, step, token, a.prompt_len + token, a.accept_lengths is not None, what)
    named = [("tokens", torch.tensor(a.tokens), torch.tensor(b.tokens)), ("logprobs", a.logprobs, b.logprobs)]
    if a.captured is not None and b.captured is not None:
        named.append(("captured", a.captured, b.captured))
    if a.accept_lengths is not None and b.accept_lengths is not None:
        named.append(("accept_lengths", torch.tensor(a.accept_lengths), torch.tensor(b.accept_lengths)))
    for name, x, y in named:
        td = diff_tensor(f"{name}_{i}", x, y)
        if td is not None:
            td.sides = sides
            d.diffs.append(td)
    return d


@dataclass
class OpDivergence:
    """Level 2: the first boundary and the first op whose traced bits differ."""
    positions: list[int]                  # the re-run rows' positions
    ops: int                              # how many ops were compared
    boundary: TensorDiff | None = None
    op: TensorDiff | None = None
    equal_before: int = 0                 # ops before the first differing one, all equal
    rows: dict[str, list[int]] = field(default_factory=dict)   # op -> its rows' positions


def compare_traces(reference: OpTrace, other: OpTrace, sides: tuple[str, str]) -> OpDivergence:
    names = list(reference.ops) + [n for n in other.ops if n not in reference.ops]
    out = OpDivergence(reference.positions, len(names))
    for k, name in enumerate(names):
        a, b = reference.ops.get(name), other.ops.get(name)
        if a is None or b is None:
            d = TensorDiff(name, "missing", f"traced in {sides[0] if b is None else sides[1]} only")
        else:
            d = diff_tensor(name, a, b)
        if d is None:
            continue
        d.sides = sides
        out.rows[name] = reference.row_positions.get(name) or other.row_positions.get(name) or []
        if out.op is None:
            out.op, out.equal_before = d, k
        if out.boundary is None and name.startswith("boundary."):
            out.boundary = d
    return out


def describe_op(name: str) -> str:
    op = op_of(name)
    if op == "boundary":
        b = int(name.split(".")[1])
        return "boundary 0: the embedding output" if b == 0 else f"boundary {b}: the output of layer {b - 1}"
    layer = name[1:name.index(".")] if op != name and name.startswith("L") else None
    return (f"layer {layer}, " if layer is not None else "") + OPS.get(op, op)


MAX_EARLIER = 16          # earlier steps traced (one more run a side) for a difference the KV cache carries


@dataclass
class CacheCarry:
    """Earlier steps re-run op-traced because the first op that differs reads the KV cache: the
    earliest step whose op trace differs and its first differing op (None: every one compared is
    equal), out of `compared` steps (0 .. compared - 1) of the `before` steps that precede."""
    reader: str                           # the differing op that reads the cache, e.g. "L0.attention"
    before: int
    compared: int
    speculative: bool = False             # steps are verify rounds
    step: int | None = None
    op: str | None = None

    def text(self) -> str:
        if self.step is not None:
            return (f"  the KV cache carries an earlier step's difference: {self.reader} reads the keys and values "
                    f"earlier steps wrote, and the earliest step whose op trace differs is "
                    f"{_step_name(self.step, self.speculative)}, first at {self.op} ({describe_op(self.op)}); its own token and "
                    f"logprob came out bitwise equal, so look there, not at {self.reader}")
        rest = "" if self.compared == self.before else \
            f" (steps {self.compared}..{self.before - 1} were not re-run: at most {MAX_EARLIER} are)"
        return (f"  the earlier steps' op traces (steps 0..{self.compared - 1}) are bitwise equal{rest}: "
                f"{self.reader} differs at this step, not through the KV cache")

    def to_json(self) -> dict:
        return {"reader": self.reader, "steps_before": self.before, "steps_compared": self.compared,
                "earliest_step": self.step, "op": self.op, "what": None if self.op is None else describe_op(self.op)}


def _step_name(step: int, speculative: bool) -> str:
    return Divergence(0, step, 0, 0, speculative, []).step_name()


@dataclass
class Located:
    """What `lockstep diff` and `check --json` report for one failing comparison."""
    sides: tuple[str, str]                # (the reference, the other side): ("golden", "this run"),
    divergence: Divergence                #   or ("the spec's run", a variant's name)
    ops: OpDivergence | None = None
    note: str = ""
    cache: CacheCarry | None = None       # an attention's difference traced back through the KV cache

    def text(self) -> str:
        d = self.divergence
        lines = [f"{self.sides[1]} vs {self.sides[0]}, first divergence: request {d.request}, {d.step_name()}, "
                 f"token {d.token} "
                 f"(sequence position {d.position}, sampled from the logits at position {d.position - 1}): "
                 f"{', '.join(d.what)} differ"]
        lines += ["  " + ln for td in d.diffs for ln in td.describe().splitlines()]
        o = self.ops
        if o is not None:
            where = f"positions {o.positions[0]}..{o.positions[-1]}" if o.positions else "no rows"
            lines.append(f"re-ran {d.step_name()} of request {d.request} on both sides, every op traced "
                         f"({o.ops} ops, {where}):")
            if o.ops == 0:
                lines.append("  nothing was traced: neither side ran that step of that request")
            elif o.op is None:
                lines.append("  every traced op is bitwise equal: the divergence did not reproduce on the re-run")
            else:
                if o.boundary is not None:
                    lines.append(f"  first boundary that differs: {describe_op(o.boundary.name)}")
                    lines += self._tensor(o.boundary)
                else:
                    lines.append("  every boundary is bitwise equal")
                lines.append(f"  first op that differs: {o.op.name} ({describe_op(o.op.name)}); "
                             f"the {o.equal_before} ops before it are bitwise equal")
                lines += self._tensor(o.op)
            if self.cache is not None:
                lines.append(self.cache.text())
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)

    def _tensor(self, td: TensorDiff) -> list[str]:
        lines = ["    " + ln for ln in td.describe().splitlines()]
        rows = self.ops.rows.get(td.name) if self.ops else None
        if td.problem == "bits" and rows and td.first_index and td.first_index[0] < len(rows):
            lines.append(f"      (row {td.first_index[0]} is position {rows[td.first_index[0]]})")
        return lines

    def to_json(self) -> dict:
        d, o = self.divergence, self.ops
        out = {"reference": self.sides[0], "other": self.sides[1], "request": d.request, "step": d.step,
               "step_name": d.step_name(), "token": d.token, "position": d.position, "differs": d.what,
               "diffs": [td.to_json() for td in d.diffs], "note": self.note, "rerun": None,
               "cache": None if self.cache is None else self.cache.to_json()}
        if o is not None:
            def named(td):
                return None if td is None else {"name": td.name, "op": op_of(td.name), "what": describe_op(td.name),
                                                 "diff": td.to_json(), "row_positions": o.rows.get(td.name, [])}
            out["rerun"] = {"positions": o.positions, "ops_compared": o.ops, "equal_before": o.equal_before,
                            "boundary": named(o.boundary), "op": named(o.op)}
        return out


def locate(sides: tuple[str, str], divergence: Divergence, rerun_reference: Callable[[OpTrace], None] | None,
           rerun_other: Callable[[OpTrace], None] | None, request_in: tuple[int, int] | None = None) -> Located:
    """Level 2 for a level-1 `divergence` between sides (reference, other): rerun_*(trace) runs a
    side again with `trace` attached; `request_in`: the request's index in each side's re-run call
    (default: its own index)."""
    d = divergence
    located = Located(sides, d)
    if rerun_reference is None or rerun_other is None:
        return located
    i_ref, i_other = request_in or (d.request, d.request)
    traces = OpTrace(i_ref, d.step), OpTrace(i_other, d.step)
    try:
        rerun_reference(traces[0])
        rerun_other(traces[1])
    except Exception as e:  # noqa: BLE001 - a crash of the re-run is reported, not raised
        located.note = f"the re-run with every op traced failed: {type(e).__name__}: {e}"
        return located
    located.ops = compare_traces(*traces, sides)
    first = located.ops.op
    if first is not None and op_of(first.name) == "attention" and d.step > 0:
        try:
            located.cache = _earlier(d, first.name, rerun_reference, rerun_other, (i_ref, i_other), sides)
        except Exception as e:  # noqa: BLE001 - as above: the located op stands, the search is reported
            located.note = f"re-running the earlier steps with every op traced failed: {type(e).__name__}: {e}"
    return located


def _earlier(d: Divergence, reader: str, rerun_reference, rerun_other, rows: tuple[int, int],
             sides: tuple[str, str]) -> CacheCarry:
    """The earliest of steps 0 .. d.step - 1 (at most MAX_EARLIER) whose op trace differs: one more
    run of each side, observed at all those steps at once."""
    carry = CacheCarry(reader, d.step, min(d.step, MAX_EARLIER), d.speculative)
    steps = range(carry.compared)
    ref, other = StepsTrace(rows[0], steps), StepsTrace(rows[1], steps)
    rerun_reference(ref)
    rerun_other(other)
    for k, a, b in zip(steps, ref.parts, other.parts):
        found = compare_traces(a, b, sides).op
        if found is not None:
            carry.step, carry.op = k, found.name
            break
    return carry


class StepsTrace:
    """An engine observer that keeps one request's rows at several steps: an engine.trace.OpTrace
    per step, each told everything the run tells an observer (it keeps only its own step's)."""

    def __init__(self, request: int, steps):
        self.parts = [OpTrace(request, k) for k in steps]

    def rows(self, requests, steps) -> None:
        for p in self.parts:
            p.rows(requests, steps)

    def event(self, request: int, step: int, name: str, value) -> None:
        for p in self.parts:
            p.event(request, step, name, value)

    def begin(self, positions: torch.Tensor) -> None:
        for p in self.parts:
            p.begin(positions)

    @property
    def recording(self) -> bool:
        return any(p.recording for p in self.parts)

    def record(self, name: str, t, rows: torch.Tensor | None = None) -> None:
        for p in self.parts:
            p.record(name, t, rows)

    def merge(self, other: "StepsTrace") -> None:
        """A rank's copy sent back (engine.parallel.run_at)."""
        if other is not self:
            for p, q in zip(self.parts, other.parts):
                p.merge(q)
