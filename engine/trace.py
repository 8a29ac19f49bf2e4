"""An op-level trace: what one request's rows went through, op by op, at one step of a run.

    trace = OpTrace(request=1, step=3)        # request 1 of the call, its decode step (or verify round) 3
    generate(model, requests, observer=trace)   # None (the default): nothing is recorded, nothing is paid
    trace.ops["L0.attention"]               # [rows, Hq, D]: that request's rows of that step
    trace.positions                         # the sequence position of each row

The model's forward hands the output of every op to `record` at named points, in the order
they run (OPS lists them); the generation loops say, before each forward call, which request
and step each row serves (`rows`), and report what they decide per request (`event`: the
sampled token, a draft tree, a verify outcome). Only the chosen request's rows of the chosen
step are kept, as fp32/int copies on the CPU: a trace observes, it never changes a value.
`OpTrace()` without a request keeps every row of every forward call (direct forward calls: set
`model.trace = OpTrace()` around them). The loops attach their observer to the model only for
the duration of the call (engine.generate.observing), so a shared model is left as it was.

A parallel model (engine/parallel.py) records the same names with every sharded tensor
gathered to its one-device layout, so a topology's trace compares element by element with one
device's. Step numbering: 0 is the prefill (all its chunks); step s >= 1 is the decode step
that samples the request's token s (engine.generate) or verify round s (engine.speculative).
"""

from __future__ import annotations

from typing import Sequence

import torch

# What each point name means, in the order a forward runs them (per block i: "L{i}.<op>").
OPS = {
    "embed": "embedding lookup (boundary 0)",
    "attn_norm": "attention RMSNorm",
    "qkv": "q, k, v projections + RoPE (heads: q, then k, then v)",
    "attention": "attention over the KV cache (sinks, window, fixed key tiles)",
    "o_proj.partials": "o_proj partial products, one per fixed K chunk",
    "o_proj": "o_proj reduction: the K chunks added in the fixed tree, + bias",
    "mlp_norm": "MoE RMSNorm",
    "router": "router logits",
    "router.top_ids": "router top-k expert ids",
    "routing": "routing weights (softmax over the top k)",
    "experts": "experts: gate_up, clamped SwiGLU and down partial products per (token, slot, K chunk)",
    "down": "down reduction: the K chunks added in the fixed tree, + bias, per (token, slot)",
    "moe": "MoE output: routing-weighted slot outputs added in slot order",
    "boundary": "block output (the residual stream)",
    "final_norm": "final RMSNorm",
    "lm_head": "lm_head logits",
    "sampling": "the sampled token and its logprob",
    "draft": "the draft tree (tokens, parents)",
    "verify": "verify: accepted nodes, then the bonus / correction token",
}


def op_of(name: str) -> str:
    """'L3.o_proj' -> 'o_proj'; 'boundary.4' -> 'boundary'; 'sampling.token' -> 'sampling'."""
    if name.startswith("L") and "." in name and name[1:name.index(".")].isdigit():
        return name[name.index(".") + 1:]
    return name.split(".")[0] if name.split(".")[0] in OPS else name


class OpTrace:
    """Keeps request `request`'s rows of step `step` (see the module docstring); OpTrace(): every row."""

    def __init__(self, request: int | None = None, step: int | None = None):
        self.request, self.step = request, step
        self.positions: list[int] = []                 # of the rows kept, in order
        self.ops: dict[str, torch.Tensor] = {}         # name -> [rows, ...], in the order they ran
        self.row_positions: dict[str, list[int]] = {}  # name -> the position of each of its rows
        self._next: tuple[list[int], list[int]] | None = None    # (requests, steps) of the next forward
        self._rows: torch.Tensor | None = None                    # this forward's rows to keep, or None
        self._positions: list[int] = []                           # every row's position, this forward

    # ---------------------------------------------------------------- from the generation loops
    def rows(self, requests: Sequence[int], steps: Sequence[int]) -> None:
        """Before a target forward call: the request (-1: padding) and step each row serves."""
        self._next = (list(requests), list(steps))

    def event(self, request: int, step: int, name: str, value) -> None:
        """A per-request decision of the loop (a token, a tree, a verify outcome)."""
        if self.request is not None and (request, step) == (self.request, self.step):
            self._add(name, torch.as_tensor(value).detach().cpu().reshape(-1), [])

    # ---------------------------------------------------------------- from the model's forward
    def begin(self, positions: torch.Tensor) -> None:
        """Start of a forward call over rows at `positions` [T]: decide which rows to keep."""
        T = positions.shape[0]
        if self.request is None:
            keep = list(range(T))
        elif self._next is None or len(self._next[0]) != T:
            keep = []                                   # a forward the loop did not announce
        else:
            keep = [t for t, (r, s) in enumerate(zip(*self._next)) if (r, s) == (self.request, self.step)]
        self._next = None
        self._rows = torch.tensor(keep, dtype=torch.int64) if keep else None
        self._positions = positions.cpu().tolist()
        if keep:
            self.positions += [self._positions[t] for t in keep]

    @property
    def recording(self) -> bool:
        """Whether the current forward call has rows to keep (a parallel model gathers only then)."""
        return self._rows is not None

    def record(self, name: str, t, rows: torch.Tensor | None = None) -> None:
        """`t` [rows, ...] (or a list of such tensors, stacked along dim 1): the output of op `name`
        for every row of the forward call, or for the forward rows listed in `rows` only."""
        if self._rows is None:
            return
        if isinstance(t, (list, tuple)):
            t = torch.stack(list(t), dim=1)
        t = t.detach().cpu()
        kept = self._rows.tolist()
        if rows is None:
            picked = kept
        else:                                       # t's row j is forward row rows[j]
            where = {r: j for j, r in enumerate(rows.cpu().tolist())}
            kept = [r for r in kept if r in where]
            picked = [where[r] for r in kept]
        self._add(name, t.index_select(0, torch.tensor(picked, dtype=torch.int64)),
                  [self._positions[r] for r in kept])

    def _add(self, name: str, t: torch.Tensor, positions: list[int]) -> None:
        prev = self.ops.get(name)
        self.ops[name] = t.clone() if prev is None else torch.cat([prev, t])
        self.row_positions[name] = self.row_positions.get(name, []) + positions

    def merge(self, other: "OpTrace") -> None:
        """Take over another trace's records (a rank's trace, sent back to the caller)."""
        if other is not self:
            self.positions, self.ops = list(other.positions), dict(other.ops)
            self.row_positions = dict(other.row_positions)


class Recorder:
    """Where a model's ops hand their outputs (`record(name, t)`): to `trace` while it records a
    forward call's rows, else nowhere. It returns t unchanged, so a trace observes and never
    alters. `gather` (a sharded model's) first turns a rank's shard into the one-device tensor;
    it runs only while recording (collectives: every rank records the same points)."""

    def __init__(self):
        self.trace: OpTrace | None = None

    @property
    def recording(self) -> bool:
        return self.trace is not None and self.trace.recording

    def __call__(self, name: str, t, rows: torch.Tensor | None = None, gather=None):
        if self.recording:
            self.trace.record(name, gather(t) if gather is not None else t, rows)
        return t
