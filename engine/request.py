"""What a generation is asked for and what it gives back: the one request type.

    req = Request(prompt=[1, 2, 3], params=SamplingParams(temperature=0.8, max_new_tokens=16), seed=7)
    Request.from_dict(req.to_dict()) == req          # the trace's and the spec's form
    generate(model, [req])[0]                        # -> Result

Everyone spells a request this way: the engine (engine.generate, engine.speculative,
engine.parallel), the targets (harness/targets: every adapter takes a list of Request and
returns a list of Result), traces (harness/replay writes `to_dict` and reads `from_dict`) and
specs (a generate spec's request is the same dict, its prompt an IntSeq). Each field is
validated once, here, when the object is made (a ValueError names the field); what needs the
model (the vocabulary, the context length) is `check_request`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Sequence

import torch

INT64_MIN, UINT64_END = -(1 << 63), 1 << 64


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 or greedy=True -> greedy. top_k 0, top_p 1 and min_p 0 switch a mask off.
    stop_token_ids None -> the model's EOS list."""
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    max_new_tokens: int = 16
    greedy: bool = False
    stop_token_ids: tuple[int, ...] | None = None

    def __post_init__(self):
        def bad(name, why):
            raise ValueError(f"SamplingParams.{name}: {why}, got {getattr(self, name)!r}")

        def is_num(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

        if not is_num(self.temperature) or self.temperature < 0:
            bad("temperature", "must be a finite number >= 0")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            bad("top_k", "must be an int >= 0 (0 = off)")
        if not is_num(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", "must be in (0, 1]")
        if not is_num(self.min_p) or not 0 <= self.min_p <= 1:
            bad("min_p", "must be in [0, 1]")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or self.max_new_tokens < 1:
            bad("max_new_tokens", "must be an int >= 1")
        if not isinstance(self.greedy, bool):
            bad("greedy", "must be a bool")
        if self.stop_token_ids is not None:
            ids = tuple(self.stop_token_ids)
            if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in ids):
                bad("stop_token_ids", "must be non-negative ints")
            object.__setattr__(self, "stop_token_ids", ids)

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0

    def to_dict(self) -> dict:
        """Every field, stop_token_ids as a list (or None): the trace's `sampling` record."""
        d = asdict(self)
        d["stop_token_ids"] = None if self.stop_token_ids is None else list(self.stop_token_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict | None) -> "SamplingParams":
        """A trace's or a spec's `sampling` mapping: a missing or null field takes its default;
        an unknown one is refused, naming it."""
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"SamplingParams: unknown field {unknown[0]!r} (known: {', '.join(sorted(known))})")
        return cls(**{k: v for k, v in d.items() if v is not None})


# The name of DESIGN §5's coin contract (murmur3(seed, position, column) Gumbel-max): the RNG model a
# target declares (harness.target: Target.rng) when its seeded sampling draws exactly as this engine's.
COIN_CONTRACT = "lockstep-coins-1"


def seed_as_int64(seed: int) -> int:
    """Seeds in [-2^63, 2^64) as int64 (two's complement wrap, as the hash reads them)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not INT64_MIN <= seed < UINT64_END:
        raise ValueError(f"Request.seed: must be an int in [-2^63, 2^64), got {seed!r}")
    return seed - (1 << 64) if seed >= (1 << 63) else seed


@dataclass
class Request:
    """One prompt to continue. seed None: greedy, or unseeded sampling from an explicit generator."""
    prompt: Sequence[int]
    params: SamplingParams = SamplingParams()
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

    def stop_ids(self, eos: Sequence[int]) -> set[int]:
        """The ids that end this request: its own stop list, else the model's EOS ids."""
        return set(self.params.stop_token_ids if self.params.stop_token_ids is not None else eos)

    def to_dict(self) -> dict:
        """{prompt, sampling, seed}: the form a trace's request record and a spec's request share."""
        return {"prompt": list(self.prompt), "sampling": self.params.to_dict(), "seed": self.seed}

    @classmethod
    def from_dict(cls, d: dict) -> "Request":
        return cls(prompt=d["prompt"], params=SamplingParams.from_dict(d.get("sampling")), seed=d.get("seed"))


@dataclass
class Result:
    """What one request produced: engine.generate's, engine.speculative's and every target's."""
    tokens: list[int]                       # generated ids (the stop token included, if one was hit)
    logprobs: torch.Tensor                  # [len(tokens)] float32: log_softmax(raw logits)[token]
    finish_reason: str                      # "stop" or "length"
    captured: torch.Tensor | None = None    # [prompt + len(tokens) - 1, len(capture) * H], with capture
    accept_lengths: list[int] | None = None  # speculative: accepted drafts + 1 per verify round

    @property
    def logprob_bytes(self) -> bytes:
        return self.logprobs.numpy().tobytes()

    @property
    def mean_accept_length(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 0.0


def check_request(req: Request, vocab_size: int, index: int, max_context: int) -> None:
    """What a request needs of the model: its ids inside the vocabulary, prompt + max_new_tokens
    inside the context (ValueError naming the request and the field)."""
    V = vocab_size
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
