"""A peer's logprobs as the peer processed them, so they are compared with the same quantity here.

Engines return a sampled token's logprob from one of three distributions (the peer declares which,
`import-peer --peer-logprobs`):

  raw          log softmax(logits): the model's own distribution (Lockstep's trace logprob)
  temperature  log softmax(logits / T)
  top-p        the temperature-scaled distribution restricted to the top-p nucleus and
               renormalised (engine.sampling.keep_mask's rule: ties at the cut to the lower id);
               a token outside the nucleus has logprob -inf

Lockstep's side is computed from the same fp32 logits row its teacher-forced step sampled from,
in float64 as engine.sampling does, then rounded once to float32 (the trace's precision). The
rows are read through the engine's trace hook (a StepLog that also keeps each forced token's
processed logprob), so nothing about the forward changes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lockstep.kernels import portable
from lockstep.engine.sampling import keep_mask
from lockstep.harness.replay.observe import StepLog

KINDS = ("raw", "temperature", "top-p")


@dataclass(frozen=True)
class Processing:
    kind: str = "raw"
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"--peer-logprobs must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not (self.temperature > 0 and self.temperature < float("inf")):
            raise ValueError(f"--temperature must be a positive number, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.kind == "raw" and (self.temperature != 1.0 or self.top_p != 1.0):
            raise ValueError("--temperature and --top-p describe processed logprobs: pass --peer-logprobs "
                             "temperature or top-p with them")
        if self.kind == "temperature" and self.top_p != 1.0:
            raise ValueError("--top-p goes with --peer-logprobs top-p")

    def to_json(self) -> dict:
        return {"kind": self.kind, "temperature": self.temperature, "top_p": self.top_p}

    @classmethod
    def of(cls, manifest: dict) -> "Processing":
        d = manifest.get("peer_logprobs") or {}
        return cls(d.get("kind", "raw"), float(d.get("temperature", 1.0)), float(d.get("top_p", 1.0)))


def processed_logprob(logits: torch.Tensor, token: int, p: Processing) -> float:
    """The logprob of `token` under the distribution `p` names, from one fp32 logits row [V]."""
    z = logits.detach().to("cpu", torch.float64) / p.temperature
    if p.kind == "top-p":
        z = torch.where(keep_mask(z, 0, p.top_p, 0.0), z, float("-inf"))
    return float(portable.log_softmax(z, dim=-1)[token].to(torch.float32))


class ProcessedLog(StepLog):
    """A StepLog that also keeps, for every teacher-forced step, the forced token's processed logprob."""

    def __init__(self, prompt_lens, tokens: list[list[int]], processing: Processing):
        super().__init__(prompt_lens, logits=True)
        self.tokens, self.processing = tokens, processing
        self.processed: dict[tuple[int, int], float] = {}

    def fresh(self, prompt_lens, order: list[int]) -> "ProcessedLog":
        return ProcessedLog(prompt_lens, [self.tokens[i] for i in order], self.processing)

    def take(self, sub: "ProcessedLog", back: dict[int, int]) -> None:
        super().take(sub, back)
        self.processed.update({(back[j], s): v for (j, s), v in sub.processed.items()})

    def merge(self, other) -> None:
        """A rank's copy, sent back (a topology's run): its processed logprobs too."""
        super().merge(other)
        if other is not self:
            self.processed = dict(other.processed)

    def record(self, name: str, t, rows: torch.Tensor | None = None) -> None:
        if name == "lm_head" and self._rows is not None:
            forward_rows = rows.cpu().tolist() if rows is not None else list(range(t.shape[0]))
            for j, fr in enumerate(forward_rows):
                if fr < len(self._labels) and self._sampling_row(fr):
                    r, s = self._labels[fr]
                    if s < len(self.tokens[r]):
                        self.processed[r, s] = processed_logprob(t[j], self.tokens[r][s], self.processing)
        super().record(name, t, rows)

    def logprobs(self, request: int, n: int) -> list[float]:
        """The request's first n processed logprobs (a step the hook never saw is an error, not a guess)."""
        missing = [k for k in range(n) if (request, k) not in self.processed]
        if missing:
            raise ValueError(f"request {request}: no logits row was observed for step {missing[0]} (processed "
                             "logprobs need a one-device, decode-shaped teacher-forced run)")
        return [self.processed[request, k] for k in range(n)]


def forced_log(manifest: dict, prompt_lens: list[int], tokens: list[list[int]]) -> StepLog:
    """The StepLog of a teacher-forced replay: a ProcessedLog when the trace declares processed logprobs."""
    processing = Processing.of(manifest)
    if processing.kind == "raw":
        return StepLog(prompt_lens, logits=True)
    return ProcessedLog(prompt_lens, tokens, processing)


def apply(log: StepLog, results) -> None:
    """Put the processed logprobs in place of each teacher-forced result's raw ones (float32, as a
    trace stores them), so every comparison after this reads the declared quantity; nothing for raw."""
    if not isinstance(log, ProcessedLog):
        return
    for i, res in enumerate(results):
        res.logprobs = torch.tensor(log.logprobs(i, len(res.logprobs)), dtype=torch.float32)
