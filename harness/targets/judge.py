"""Judging one spec's run on a target without goldens of its own (`has_goldens` False: every
adapter, judged against its expectations file): pass, fail or n/a.

The run itself is the kind's own (`harness/kinds/<kind>.py: run(spec, ctx, target)`); how each
kind applies to a target, and how its result is compared, live in that module too (its
`applicability` and `compared`). What is judged here is the same for every kind:

- n/a: the target lacks an operation or feature the spec needs (`NotApplicable`, with its reason);
- the kind's own checks (`check`), except that an expected refusal is judged by its facts
  (harness/target.py, "Refusals"): the kind's `refusal(result)` gives the message;
- the golden, when the kind compares with one: bitwise (the same golden bit for bit) or within
  CROSS_ATOL + CROSS_RTOL |golden| (two implementations of one whole model);
- a crash of the implementation under test: a failure with one located line.

Anything a target cannot run is `n/a` with the reason, never skipped or passed.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from dataclasses import dataclass, field

import torch

from lockstep.harness import kinds
from lockstep.harness.checkpoints import model_for, target_dir
from lockstep.harness.compare import diff_data, diff_tensors
from lockstep.harness.errors import full_traceback, where
from lockstep.harness.golden import CorruptGolden, GoldenStore, json_roundtrip
from lockstep.harness.kinds.generate import _requests, project_root
from lockstep.harness.result import SpecResult, RunContext
from lockstep.harness.specfile import Spec
from lockstep.harness.target import (BITWISE, CALIBRATED, CHI_SQUARE, RNG_COINS, TOLERANCE, NotApplicable,  # noqa: F401
                                     Target, UpstreamChanged)
from lockstep.harness.targets import agreement, locator
from lockstep.harness.targets.lockstep_run import prompt_states
from lockstep.harness.targets.bounds import bound

PASS, FAIL, NA = "pass", "fail", "n/a"
# Two implementations of one whole model in fp32 sum in different orders: |a - b| <= ATOL + RTOL |b|
# (tests/engine/test_hf_agreement.py: max ~5e-6 on logits of size ~5 for 2 blocks).
# Measured on the 2-block tiny preset; over the 24 and 36 blocks of tiny-d24 / tiny-d36 the same
# rounding reaches 5e-4 (HF, layer_ids forward specs), so whole-model comparisons use 1e-3: a real
# convention error (window off by one, sink scaled, RoPE interleaved, router softmax) moves 1e-2 or more.
CROSS_ATOL = CROSS_RTOL = 1e-3


@dataclass
class TargetOutcome:
    spec: Spec
    target: str
    status: str                      # pass | fail | n/a
    compare: str = ""                # bitwise | tolerance
    message: str = ""                # the first mismatch (fail) or the reason (n/a)
    messages: list[str] = field(default_factory=list)
    seconds: float = 0.0
    traceback: str = ""              # of a crash: shown with --debug (and in pytest's report)
    notes: list[str] = field(default_factory=list)   # observations that never fail: unclaimed properties, near-ties

    def to_json(self) -> dict:
        return {"id": self.spec.id, "kind": self.spec.kind, "target": self.target, "status": self.status,
                "compare": self.compare, "message": self.message, "messages": list(self.messages),
                "notes": list(self.notes), "seconds": round(self.seconds, 3)}


# --------------------------------------------------------------------------- refusals judged by their facts
_NUMBER = re.compile(r"(?<![\w.-])-?\d+(?![\w.])")
_TENSOR = re.compile(r"^[A-Za-z_][\w]*(\.[\w]+)+$")       # model.layers.2.mlp.experts.down_proj_scales


def error_facts(fragments: list[str]) -> list:
    """The facts an error spec's expected fragments name — whole numbers (ids, bounds, counts,
    widths, indices) and tensor names: a target's refusal must name these, in its own words."""
    return [f for f in fragments if _TENSOR.match(f)] + \
        [int(m) for f in fragments if not _TENSOR.match(f) for m in _NUMBER.findall(f)]


def _missing_facts(fragments: list[str], message: str) -> list:
    named = {int(m) for m in _NUMBER.findall(message)}
    return [f for f in error_facts(fragments) if (f not in message if isinstance(f, str) else f not in named)]


def check_on_target(spec, result: SpecResult) -> list[str]:
    """The kind's checks, except that an expected refusal is judged by its facts, not its wording
    (the kind's `refusal(result)`: the refusal's message, or None when the run did not refuse),
    and that the variants are left to `properties` (the target's claims decide them)."""
    kind = kinds.KINDS[spec.kind]
    error = spec.expect.get("error") if isinstance(spec.expect, dict) else None
    message = kind.refusal(result) if error and hasattr(kind, "refusal") else None
    if message is not None:
        missing = _missing_facts(error, message)
        return [f"the refusal does not name {missing}: {message}"] if missing else []
    return list(kind.check(spec, _without_variants(result)))


def properties(result: SpecResult, claims: frozenset[str]) -> tuple[list[str], list[str]]:
    """(failures of claimed properties, observations of unclaimed ones and of variants the target
    cannot run), each led by the property and its first divergence (request, step, what differs)."""
    facts = result.facts if isinstance(result.facts, dict) else {}
    prop, first = facts.get("variant_property", {}), facts.get("variants_first", {})
    judged, observed = [], []
    for name, differing in facts.get("variants_differing", {}).items():
        if not differing:
            continue
        p = prop.get(name, name)
        line = f"{p}: {name}: {first.get(name) or f'requests {differing} differ'}; requests {differing} differ"
        (judged if p in claims else observed).append(
            ("property (claimed) " if p in claims else "property (not claimed, observed) ") + line)
    observed += [f"property {prop.get(n, n)}: {n}: n/a ({why})" for n, why in facts.get("variants_na", {}).items()]
    return judged, observed


def _without_variants(result: SpecResult) -> SpecResult:
    """The result with no differing variant left for the kind's own check (which would fail on
    any): `properties` judges them by the target's claims."""
    facts = result.facts if isinstance(result.facts, dict) else {}
    if "variant_property" not in facts:
        return result
    kept = {n: [] for n in facts.get("variants_differing", {})}
    return dataclasses.replace(result, facts={**facts, "variants_differing": kept})


def compared(spec: Spec, ctx: RunContext, result: SpecResult) -> tuple[str, str | None]:
    """(how the result is compared, the golden platform or None): the kind's `compared`, or
    bitwise against the kind's golden when it defines none."""
    kind = kinds.KINDS[spec.kind]
    if hasattr(kind, "compared"):
        return kind.compared(spec, ctx, result)
    return BITWISE, kind.golden_platform(spec, ctx)


# --------------------------------------------------------------------------- comparison
def _tolerance_diff(golden: dict, got: dict) -> list[str]:
    out = []
    for name in sorted(set(golden) | set(got)):
        if name not in got or name not in golden:
            out.append(f"tensor {name!r} is {'missing' if name not in got else 'not in the golden'}")
            continue
        g, x = golden[name], got[name]
        if g.shape != x.shape:
            out.append(f"tensor {name!r}: shape {list(x.shape)}, the golden has {list(g.shape)}")
            continue
        if not g.is_floating_point():
            if not torch.equal(g, x.to(g.dtype)):
                i = (g != x.to(g.dtype)).nonzero()[0].tolist()
                out.append(f"tensor {name!r} differs at {i}: {x[tuple(i)].item()} instead of {g[tuple(i)].item()}")
            continue
        g64, x64 = g.to(torch.float64), x.to(torch.float64)
        err = (x64 - g64).abs().nan_to_num(nan=math.inf)
        bound = CROSS_ATOL + CROSS_RTOL * g64.abs()
        bad = err > bound
        if bad.any():
            i = bad.nonzero()[0].tolist()
            out.append(f"tensor {name!r}: {int(bad.sum())} of {g.numel()} values outside |d| <= "
                       f"{CROSS_ATOL:g} + {CROSS_RTOL:g}|golden|, first at {i}: {x64[tuple(i)].item():.9g} instead "
                       f"of {g64[tuple(i)].item():.9g} (max |d| {float(err.max()):.3g})")
    return out


def run_on_target(spec: Spec, ctx: RunContext, target: Target, store: GoldenStore) -> TargetOutcome:
    start = time.perf_counter()
    out = TargetOutcome(spec, target.label, PASS)
    try:
        with torch.inference_mode():
            result = kinds.KINDS[spec.kind].run(spec, ctx, target)
        result.data = json_roundtrip(result.data)
        out.compare, platform = compared(spec, ctx, result)
        claims = frozenset(getattr(target, "claims", frozenset()))
        judged, out.notes = properties(result, claims)
        out.notes += list(result.notes or [])
        fails = check_on_target(spec, result)
        if out.compare == CALIBRATED:               # the exact judge's failures lead, then the calibrated
            with torch.inference_mode():
                agreed, notes = _agreement(spec, ctx, result, target)
            fails, out.notes = agreed + fails, out.notes + notes
        fails = judged + fails
        if platform is not None:
            try:
                golden = store.load(platform, spec.id)
            except CorruptGolden as e:
                golden, fails = None, fails + [f"corrupt golden: {e}"]
            if golden is None:
                fails.append(f"no golden on {platform} to compare with (record it with lockstep regen {spec.id}"
                             f"{regen_flags(ctx)})")
            elif out.compare == CALIBRATED:     # tokens and logprobs judged above; the rest as before
                rest = {k: v for k, v in golden.tensors.items() if not k.startswith(("tokens_", "logprobs_"))}
                fails += _tolerance_diff(rest, {k: v for k, v in result.tensors.items() if k in rest})
            elif out.compare == BITWISE:
                fails += [d.describe() for d in diff_tensors(golden.tensors, result.tensors)]
                dd = diff_data(golden.data, result.data)
                if dd:
                    fails.append(f"data differs from the golden: {dd}")
            else:
                fails += _tolerance_diff(golden.tensors, result.tensors)
        if fails:
            out.status, out.messages = FAIL, fails
    except NotApplicable as e:
        out.status, out.message = NA, str(e)
    except UpstreamChanged as e:
        out.status, out.messages = FAIL, [f"adapter refused: {e}"]
    except Exception as e:                  # the implementation under test crashed: one located line
        crash = f"crash: {type(e).__name__}: {e}".strip().splitlines()[0]
        out.status, out.traceback = FAIL, full_traceback(e)
        out.messages = [crash + (f" (at {where(e)})" if where(e) else "")]
        out.message = crash[:300]           # what an expectations file records: no path of this machine
    if out.status == FAIL and not out.message:
        out.message = out.messages[0].splitlines()[0][:300]
    out.seconds = time.perf_counter() - start
    return out


def regen_flags(ctx: RunContext) -> str:
    """The --dtype/--backend a bare `regen ID` needs to record this run's golden pair (none for
    fp32/torch): bare, it records only the pairs the spec supports here."""
    dtype, backend = getattr(getattr(ctx, "platform", None), "dtype", "fp32"), getattr(ctx, "backend", "torch")
    return "" if (dtype, backend) == ("fp32", "torch") else f" --dtype {dtype} --backend {backend}"


class _Generation:
    """A target's generation read back from a result's tensors (tokens_i, logprobs_i)."""

    def __init__(self, tensors: dict, i: int):
        self.tokens = tensors[f"tokens_{i}"].tolist()
        self.logprobs = tensors[f"logprobs_{i}"]


def _agreement(spec: Spec, ctx: RunContext, result: SpecResult, target=None) -> tuple[list[str], list[str]]:
    """The calibrated judge (harness/targets/agreement.py) on a generate spec's run: against
    Lockstep's engine at the run's dtype policy, teacher-forced on the target's own tokens; a
    target that captures boundary states has its first forward failure placed in a block; and the
    exact sampler judge where the target's `sampling` takes params under the coin contract."""

    requests = _requests(spec)
    reference = model_for(spec.inputs["checkpoint"], "torch", project_root(spec), str(ctx.device),
                          ctx.platform.dtype)
    results = [_Generation(result.tensors, i) for i in range(len(requests))]
    fails, notes, _ = agreement.judge(requests, results, reference, bound(ctx.platform.dtype),
                                      _layer_locator(spec, ctx, target, reference), _sampler(target, str(ctx.device)))
    return fails, notes


def _layer_locator(spec: Spec, ctx: RunContext, target, reference):
    """tokens -> (block, note) through the target's `capture` and the reference's, or None where
    the target captures nothing."""
    if target is None or "capture" not in getattr(target, "ops", {}):
        return None
    try:
        capture = target.op("capture", str(ctx.device))
    except NotApplicable:
        return None

    def reference_capture(checkpoint, tokens, boundaries):
        return prompt_states(reference, tokens, boundaries)

    folder = target_dir(spec.inputs["checkpoint"], project_root(spec))
    layers = reference.config.num_hidden_layers
    return lambda tokens: locator.locate(capture, reference_capture, folder, tokens, layers, ctx.platform.dtype)


def _sampler(target, device: str):
    """The target's `sampling` with params where it declares the coin contract and runs here, else None."""
    if target is None or not target.offers("sampling", "params") or getattr(target, "rng", None) != RNG_COINS:
        return None
    try:
        return target.op("sampling", device, ("params",))
    except NotApplicable:
        return None


def applicability(spec: Spec, t: Target, device: str = "cpu") -> tuple[str, str]:
    """(how it compares, or 'n/a'; the reason) without running the spec: the kind's
    `applicability(spec, target, device)`, which raises NotApplicable with the reason."""
    kind = kinds.KINDS[spec.kind]
    try:
        if not hasattr(kind, "applicability"):
            raise NotApplicable(f"kind {spec.kind}")
        return kind.applicability(spec, t, device), ""
    except NotApplicable as e:
        return NA, str(e)
