"""StepLog: what a run did per request and step, collected through the engine's trace hook.

engine.trace.OpTrace is the engine's one observation point (it records, never changes a value);
the generation loops hand it every decision (`event`: sampled token, draft tree, verify
outcome) and, while it asks for rows, the model hands it every op's output. StepLog keeps

  - every event of every request and step (`events[(request, step)][name]`), and
  - with `logits=True`, per (request, step) only what a trace step needs of the logits row that
    step sampled from (digest, top-1/top-2 margin, chosen logprob) and the routed expert ids of
    that row in every layer: small values, so a whole run can be observed.

It is passed where an OpTrace goes (the `observer=` of generate / speculative_generate, or
generate_at's / speculative_generate_at's `trace=`: each rank observes a copy and rank 0's comes
back through `merge`).
Step numbering is engine.trace's: plain generation's step k samples token k (0 = the prefill);
speculative decoding's step r is verify round r.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import torch

from lockstep.engine.trace import OpTrace
from lockstep.harness.replay.format import f32_bits


def logits_summary(row: torch.Tensor) -> dict:
    """Digest, top-1/top-2 margin (float32 bits) and argmax of one fp32 logits row [V]."""
    row = row.detach().to("cpu", torch.float32).contiguous()
    top = torch.sort(row, descending=True, stable=True)
    margin = float(top.values[0] - top.values[1]) if row.numel() > 1 else float("inf")
    return {"logits_sha256": hashlib.sha256(row.view(torch.uint8).numpy().tobytes()).hexdigest(),
            "margin": margin, "margin_bits": f32_bits(margin), "argmax": int(top.indices[0])}


class StepLog(OpTrace):
    def __init__(self, prompt_lens: Sequence[int], logits: bool = False):
        super().__init__()
        self.prompt_lens = list(prompt_lens)
        self.want_logits = logits
        self.events: dict[tuple[int, int], dict[str, list]] = {}
        self.logits: dict[tuple[int, int], dict] = {}            # (request, step) -> logits_summary
        self.experts: dict[tuple[int, int], dict[int, list[int]]] = {}   # -> {layer: expert ids}
        self._labels: list[tuple[int, int]] = []                 # this forward's (request, step) per row

    def fresh(self, prompt_lens: Sequence[int], order: list[int]) -> "StepLog":
        """An empty log of the same kind for the requests in run `order` (harness.replay.run)."""
        return StepLog(prompt_lens, logits=self.want_logits)

    def take(self, sub: "StepLog", back: dict[int, int]) -> None:
        """`sub`'s records added to this log's, their run-order request indices mapped back through
        `back` (one sub-log per run, or one per data-parallel rank: their requests are disjoint)."""
        self.events.update({(back[j], s): v for (j, s), v in sub.events.items()})
        self.logits.update({(back[j], s): v for (j, s), v in sub.logits.items()})
        self.experts.update({(back[j], s): v for (j, s), v in sub.experts.items()})

    def event(self, request: int, step: int, name: str, value) -> None:
        v = torch.as_tensor(value).detach().cpu().reshape(-1)
        if name == "sampling.logprob":
            vals = [f32_bits(float(x)) for x in v.to(torch.float32)]
        else:
            vals = [int(x) for x in v.tolist()]
        self.events.setdefault((request, step), {})[name] = vals

    def begin(self, positions: torch.Tensor) -> None:
        T = positions.shape[0]
        labels = list(zip(*self._next)) if self._next is not None and len(self._next[0]) == T else []
        self._next = None
        self._positions = positions.cpu().tolist()
        self._labels = labels
        # rows kept = the rows whose logits a step samples from (see _sampling_row)
        self._rows = torch.tensor([t for t in range(len(labels)) if self._sampling_row(t)], dtype=torch.int64) \
            if self.want_logits and labels else None
        if self._rows is not None and not self._rows.numel():
            self._rows = None

    def _sampling_row(self, t: int) -> bool:
        r, s = self._labels[t]
        return r >= 0 and self._positions[t] == self.prompt_lens[r] - 1 + s

    def record(self, name: str, t, rows: torch.Tensor | None = None) -> None:
        if self._rows is None:
            return
        if name == "lm_head":
            forward_rows = rows.cpu().tolist() if rows is not None else list(range(t.shape[0]))
            for j, fr in enumerate(forward_rows):
                if fr < len(self._labels) and self._sampling_row(fr):
                    self.logits[self._labels[fr]] = logits_summary(t[j])
        elif name.endswith(".router.top_ids"):
            layer = int(name[1:name.index(".")])
            ids = t.detach().cpu()
            for fr in self._rows.tolist():
                self.experts.setdefault(self._labels[fr], {})[layer] = [int(x) for x in ids[fr].tolist()]

    def merge(self, other: "OpTrace") -> None:
        if other is not self:
            self.events, self.logits, self.experts = other.events, other.logits, other.experts
