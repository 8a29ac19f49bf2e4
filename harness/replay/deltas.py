"""The one comparison of logprobs between a trace (another engine's tokens and logprobs) and
Lockstep's teacher-forced run of the same tokens: `replay` and `import-peer` both use it, so they
report the same numbers for the same data.

Each side is a float32 value: the trace's is its recorded bits (a peer's printed value rounded
once to float32, as the trace stores it), Lockstep's the engine's float32 logprob. Then, per token:

  |Δ|            |lockstep - trace|  (two equal infinities: 0; one infinite side: inf)
  log ratio      lockstep - trace: log of the importance ratio π_lockstep / π_trace, the quantity an
                 RL trainer weights a rollout token by when the rollout engine sampled it
  k1, k3         the two sample estimators of KL(trace ‖ lockstep) from the trace's own samples
                 (k1 = -log ratio, k3 = (ratio - 1) - log ratio, always >= 0); their means are reported
  clip fraction  the share of tokens whose ratio lies outside [1 - clip, 1 + clip] (PPO's range)

reported overall and per request, beside the |Δ| quantiles (nearest rank) and the share of tokens
over the threshold (the verdict's: a token over it is a divergence)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from lockstep.harness.replay.format import f32_bits, f32_from_bits

CLIP = 0.2                 # the default importance-ratio clip range, PPO's ε


def trace_value(step: dict) -> float:
    """A trace step's logprob as the comparison reads it: its float32 bits."""
    return f32_from_bits(step["logprob_bits"])


def abs_delta(ours: float, theirs: float) -> float:
    d = abs(ours - theirs)
    if math.isnan(d):                                  # -inf vs -inf: the same value
        return 0.0 if ours == theirs else math.inf
    return d


def _quantile(sorted_values: list[float], p: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(p * len(sorted_values)) - 1))]


def rl_stats(pairs: list[tuple[float, float]], clip: float) -> dict:
    """mean/max |Δ|, mean k1 and k3, the importance-ratio range and the share outside the clip range,
    over (lockstep, trace) float pairs; a pair with an infinite side counts as an infinite ratio."""
    if not pairs:
        return {}
    deltas = [abs_delta(a, b) for a, b in pairs]
    logr = [(a - b) if math.isfinite(a) and math.isfinite(b) else (0.0 if a == b else (a - b)) for a, b in pairs]
    ratios = [math.inf if x == math.inf else math.exp(min(x, 700.0)) for x in logr]
    k3 = [(r - 1.0) - x if math.isfinite(x) else math.inf for r, x in zip(ratios, logr)]
    n = len(pairs)
    return {"tokens": n, "mean_abs_delta": sum(deltas) / n, "max_abs_delta": max(deltas),
            "kl_k1": -sum(logr) / n, "kl_k3": sum(k3) / n, "ratio_min": min(ratios), "ratio_max": max(ratios),
            "clip": clip, "outside_clip": sum(not (1 - clip <= r <= 1 + clip) for r in ratios) / n}


def rl_line(s: dict) -> str:
    """rl_stats' overall numbers in one line."""
    return (f"RL: mean |Δ| {s['mean_abs_delta']:.3g}, max {s['max_abs_delta']:.3g}; KL(trace‖lockstep) k1 "
            f"{s['kl_k1']:.3g}, k3 {s['kl_k3']:.3g}; importance ratio [{s['ratio_min']:.6g}, "
            f"{s['ratio_max']:.6g}], {100 * s['outside_clip']:.1f}% outside 1±{s['clip']:g}")


@dataclass
class Deltas:
    """Per-token comparison of Lockstep's logprobs with a trace's (module docstring)."""

    source: str
    threshold: float
    clip: float = CLIP
    pairs: list[list[tuple[float, float]]] = field(default_factory=list)   # per request: (lockstep, trace)
    steps: list[list[dict]] = field(default_factory=list)                   # the trace's steps compared

    def add_request(self, steps: list[dict], ours: list[float]) -> None:
        """The steps both sides have (a free run may stop early)."""
        n = min(len(steps), len(ours))
        self.steps.append(steps[:n])
        self.pairs.append([(float(ours[k]), trace_value(steps[k])) for k in range(n)])

    @property
    def deltas(self) -> list[float]:
        return [abs_delta(a, b) for req in self.pairs for a, b in req]

    @property
    def first_off(self) -> dict[int, int]:
        """request -> the first step whose |Δ| is over the threshold."""
        out = {}
        for i, req in enumerate(self.pairs):
            k = next((k for k, (a, b) in enumerate(req) if abs_delta(a, b) > self.threshold), None)
            if k is not None:
                out[i] = k
        return out

    @property
    def worst(self) -> list[dict]:
        """The 20 tokens of largest |Δ|, largest first."""
        rows = [{"request": i, "step": k, "token": self.steps[i][k]["token"], "peer": b, "lockstep": a,
                 "delta": abs_delta(a, b)} for i, req in enumerate(self.pairs) for k, (a, b) in enumerate(req)]
        return sorted(rows, key=lambda w: -w["delta"])[:20]

    def stats(self) -> dict:
        d = sorted(self.deltas)
        if not d:
            return {}
        flat = [p for req in self.pairs for p in req]
        return {"tokens": len(d), "bitwise_equal": sum(f32_bits(a) == f32_bits(b) for a, b in flat),
                "p50": _quantile(d, 0.5), "p95": _quantile(d, 0.95), "p99": _quantile(d, 0.99), "max": d[-1],
                "mean": sum(d) / len(d), "share_over_threshold": sum(x > self.threshold for x in d) / len(d),
                "threshold": self.threshold, "rl": rl_stats(flat, self.clip)}

    def per_request(self) -> list[dict]:
        return [{"request": i, **rl_stats(req, self.clip)} for i, req in enumerate(self.pairs)]

    def rl_text(self) -> list[str]:
        """The RL lines of a report: overall, then the requests with the largest max |Δ| (at most 5)."""
        s = self.stats().get("rl")
        if not s:
            return []
        lines = [rl_line(s)]
        worst = sorted((r for r in self.per_request() if r.get("tokens")), key=lambda r: -r["max_abs_delta"])[:5]
        for r in worst:
            lines.append(f"  request {r['request']}: max |Δ| {r['max_abs_delta']:.3g}, k3 {r['kl_k3']:.3g}, ratio "
                         f"[{r['ratio_min']:.6g}, {r['ratio_max']:.6g}], {100 * r['outside_clip']:.1f}% outside clip")
        return lines
