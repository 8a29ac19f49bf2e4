"""The calibrated judge's bounds, one per dtype policy, derived from a measured spread.

SPREAD[d] is what separates two correct implementations of the reference at dtype policy d,
teacher-forced over every token of the bundled generate specs (scripts/calibrate_bounds.py
measures it; docs/targets.md, "The calibrated judge", has the table and the command):
  fp32  Lockstep's invariant torch backend vs its `fast` backend (library GEMMs and reductions,
        the numerics of an ordinary fp32 engine);
  bf16  Lockstep's bf16 policy vs its fp32 policy (bf16 rounding of weights and activations).
p50 / p99 / max: the largest per-spec quantile of |logprob difference|; flip: the largest margin
(top-1 minus top-2 of the reference's decision scores) at a step where the other implementation
would choose another token.

The bounds: another correct engine sits about as far from the exact values as the second
implementation does, and so does the reference, so the two may differ by twice the spread:
each quantile of an engine's |Δ logprob| must stay within twice the spread's, and another
token is a near-tie where the reference's margin is within twice the largest flip seen.
tests/targets/test_judges.py re-measures two specs and checks they stay within SPREAD.
"""

from __future__ import annotations

from dataclasses import dataclass

# python3 scripts/calibrate_bounds.py (every generate spec without a draft; CPU, torch 2.13)
SPREAD = {
    "fp32": {"p50": 1.91e-06, "p99": 2.39e-06, "max": 2.39e-06, "flip": 0.0},
    "bf16": {"p50": 0.025, "p99": 0.877, "max": 1.55, "flip": 2.2},
}


@dataclass(frozen=True)
class Bound:
    dtype: str
    p50: float            # |Δ logprob| between the engine and the reference: the median over a spec,
    p99: float            # its 99th percentile,
    logprob: float        # and every token
    near_tie: float       # the reference's top-1 minus top-2 within which another choice is allowed


def bound(dtype: str) -> Bound:
    """The bound of a dtype policy; ValueError naming the policies that have one."""
    if dtype not in SPREAD:
        raise ValueError(f"no calibrated bound for dtype policy {dtype!r}; calibrated: {', '.join(SPREAD)}")
    s = SPREAD[dtype]
    return Bound(dtype, p50=2 * s["p50"], p99=2 * s["p99"], logprob=2 * s["max"],
                 near_tie=2 * max(s["flip"], s["p99"]))
