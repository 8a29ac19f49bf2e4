"""`lockstep replay TRACE`: run a trace again and judge it step by step (DESIGN §10).

    report = replay(read_trace(path), mode="free-run", overrides={"prefill_chunk": 7, "tp": 2})

Before anything runs, the trace must be for this checkpoint (weight digests), this draft and this
platform (harness.replay.identity); a replay may change the batch composition (`order`), the
batch size, the prefill chunk, the topology and the backend, and nothing else.

Modes:
  free-run        sample again (the recorded seeds, the coin contract): tokens, logprob bits,
                  stop and, speculative, the draft trees and accept lengths must all match.
  teacher-forced  feed the recorded tokens and recompute each step (plain generation with forced
                  tokens): logprob bits, the logits row's digest and the routed experts must match.

A step's verdict (`Verdict`): `bitwise`; `bits` (same token, other bits: |Δlogprob| and ULP);
`token` (another token; `near-tie` when the recorded top-1/top-2 margin is below the threshold);
`control` (another control flow: accept length or draft tree, routed experts, or where it
stopped); `not recorded` (teacher-forced: the chosen logprob is bitwise, but the trace lacks a
measurement the mode checks, the logits row's digest or the routed experts: it was not checked,
and the step says so rather than passing silently; not a divergence). The first step that is not bitwise is handed to harness.locate, which re-runs that
step of that request on both sides (the recorded setup and the replay's) with every op traced
and names the layer and op where they part.

A trace of another engine (an imported peer run, or a `record --target` run of any target
but `lockstep`) is judged across implementations, never by a claim of
bitwise equality (DESIGN §10): the verdicts are the same, but a `bits` step whose |Δlogprob| is
within `threshold` (default 1e-3, import-peer's) is accepted, the report carries the per-token
statistics (p50 / p95 / p99 / max |Δ|, the share over the threshold; the mean only beside them),
and the first step over the threshold is the divergence. Nothing is located: the trace's side
cannot be re-run here. Free-run applies only when every request is greedy or was sampled under
Lockstep's coin contract; a seed of another RNG model is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

import torch

from lockstep.engine.request import Request
from lockstep.harness import locate as locator
from lockstep.harness.locate import Divergence, RequestBits, first_divergence
from lockstep.harness.replay import processed
from lockstep.harness.replay.context import replay_notes
from lockstep.harness.replay.deltas import Deltas, rl_line
from lockstep.harness.replay.format import Trace, TraceError, f32_bits, f32_bits_all, f32_from_bits
from lockstep.harness.replay.identity import check_checkpoint, check_platform, platform_identity
from lockstep.harness.replay.observe import StepLog
from lockstep.harness.replay.run import Setup, checkpoint_folder, draft_folder, forced_requests, run
from lockstep.harness.replay.spread import degree

MODES = ("free-run", "teacher-forced")
OVERRIDABLE = ("backend", "tp", "ep", "max_batch", "prefill_chunk", "order", "forced_shape", "device", "dtype")
NEAR_TIE = 1e-3           # default margin (top-1 minus top-2 logit) under which a token flip is a near-tie
THRESHOLD = 1e-3          # another engine's trace: |Δlogprob| accepted per step (import-peer's default)
REPLAYABLE_RNG = ("lockstep-coins-1", "none (greedy)")     # the RNG models free-run can draw again


class Verdict(str, Enum):
    """A step's verdict; its value is what the text and JSON reports print."""
    BITWISE = "bitwise"
    BITS = "bits"
    TOKEN = "token"
    NEAR_TIE = "near-tie"
    CONTROL = "control"
    NOT_RECORDED = "not recorded"

    def __str__(self) -> str:             # the value, on every Python (3.12 changed mixed-in enums' format)
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass
class StepVerdict:
    request: int
    step: int                 # token index (plain and teacher-forced), as the trace's step records
    status: Verdict
    detail: str = ""
    dlogprob: float = 0.0
    ulp: int = 0

    def to_json(self) -> dict:
        return {**vars(self), "status": self.status.value}


@dataclass
class ReplayReport:
    mode: str
    setup: dict
    verdicts: list[StepVerdict] = field(default_factory=list)   # every step of every request
    first: StepVerdict | None = None
    located: object | None = None                               # harness.locate.Located
    threshold: float | None = None      # another engine's trace: the |Δlogprob| a step may differ by
    stats: dict | None = None           # and the per-token statistics of |Δlogprob|
    notes: list[str] = field(default_factory=list)   # what the verdict cannot see (harness/replay/context.py)
    rl: dict | None = None              # another engine's trace: {"overall": rl_stats, "per_request": [...]}
    replayed: list | None = None        # the replay's own logprob bits per request (a peer spec's golden holds them)

    @property
    def bitwise(self) -> bool:
        return all(v.status == Verdict.BITWISE for v in self.verdicts)

    @property
    def ok(self) -> bool:
        """Every step bitwise or, for another engine's trace, within the threshold."""
        return self.first is None

    def counts(self) -> dict:
        out: dict[str, int] = {}
        for v in self.verdicts:
            out[v.status.value] = out.get(v.status.value, 0) + 1
        return out

    def text(self) -> str:
        c = self.counts()
        lines = [f"replay ({self.mode}; {', '.join(f'{k} {v}' for k, v in sorted(self.setup.items()))}): "
                 f"{len(self.verdicts)} steps, " + ", ".join(f"{n} {k}" for k, n in sorted(c.items()))]
        if self.stats:
            st = self.stats
            lines.append(f"another engine's trace: |Δlogprob| p50 {st['p50']:.3g}, p95 {st['p95']:.3g}, "
                         f"p99 {st['p99']:.3g}, max {st['max']:.3g} (mean {st['mean']:.3g}); "
                         f"{100 * st['share_over_threshold']:.1f}% over {self.threshold:g}; "
                         f"{st['bitwise_equal']} of {st['tokens']} bitwise equal")
        unchecked = c.get(Verdict.NOT_RECORDED.value, 0)
        if self.first is None and unchecked:
            lines.append(f"no step diverges, but {unchecked} of {len(self.verdicts)} steps were not fully checked: "
                         f"the trace did not record what teacher-forcing compares (not recorded)")
        elif self.first is None:
            lines.append("every step is bitwise equal to the trace" if self.bitwise else
                         f"every step is within |Δlogprob| <= {self.threshold:g} of the trace (not bitwise: "
                         f"another implementation)")
        else:
            f = self.first
            lines.append(f"first divergence: request {f.request}, step {f.step}: {f.status}: {f.detail}")
            if self.located is not None:
                lines.append(self.located.text())
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"mode": self.mode, "setup": self.setup, "bitwise": self.bitwise, "ok": self.ok,
                "threshold": self.threshold, "stats": self.stats, "counts": self.counts(),
                "first": None if self.first is None else self.first.to_json(),
                "located": None if self.located is None else self.located.to_json(),
                "divergent": [v.to_json() for v in self.verdicts if v.status != Verdict.BITWISE][:200]}

    # to_json and text are what the `replay` spec kind stores in its goldens: they keep their shape.
    # The command prints these, which add the RL statistics and the notes.
    def command_json(self) -> dict:
        doc = self.to_json()
        if self.rl:
            doc["stats"] = {**doc["stats"], "rl": self.rl["overall"], "per_request": self.rl["per_request"]}
        return doc | {"notes": self.notes}

    def command_text(self) -> str:
        lines = [self.text()] + ([rl_line(self.rl["overall"])] if self.rl and self.rl["overall"] else [])
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


def ulp_distance(a_bits: str, b_bits: str) -> int:
    """How many float32 values lie between two (hex bits): -0.0 and +0.0 are one value (0 apart),
    the smallest subnormals of either sign are 1 from zero."""
    def ordered(h):
        u = int(h, 16)
        return -(u & 0x7FFFFFFF) if u & (1 << 31) else u      # sign-magnitude to a line monotone in the value
    return abs(ordered(a_bits) - ordered(b_bits))


# ---------------------------------------------------------------- from a trace back to a run
def recorded_setup(trace: Trace) -> Setup:
    s, m = trace.manifest["settings"], trace.manifest
    return Setup(checkpoint=m["checkpoint"]["ref"], dtype=s["dtype"], backend=s["backend"], tp=s["tp"], ep=s["ep"],
                 max_batch=s["max_batch"], prefill_chunk=s["prefill_chunk"],
                 draft=(m.get("draft") or {}).get("ref"), speculative=m.get("speculative"), device=s["device"])


def requests_of(trace: Trace) -> list[Request]:
    try:
        return [Request.from_dict(r) for r in trace.requests]
    except (KeyError, TypeError, ValueError) as e:
        raise TraceError(f"a request record is unusable: {e}") from None


def replay_setup(trace: Trace, overrides: dict) -> Setup:
    bad = sorted(set(overrides) - set(OVERRIDABLE) - {"checkpoint"})
    if bad:
        raise TraceError(f"a replay may not change {', '.join(bad)} (only {', '.join(OVERRIDABLE)})")
    setup = recorded_setup(trace)
    for k, v in overrides.items():
        if v is not None:
            setattr(setup, k, v)
    order = setup.order
    if order is not None and sorted(order) != list(range(len(trace.requests))):
        raise TraceError(f"--order must list every request index 0..{len(trace.requests) - 1} once, got {order}")
    return setup


def check_identity(trace: Trace, setup: Setup) -> None:
    """The checkpoint must be the trace's; so must the platform, unless the trace is another
    engine's (judged with a tolerance: Lockstep's side may run on any device and dtype)."""
    if not foreign(trace):
        check_platform(trace.manifest["platform"], platform_identity(setup.dtype, setup.backend, setup.device))
    check_checkpoint(trace.manifest["checkpoint"], checkpoint_folder(setup))
    if setup.draft is not None:
        check_checkpoint(trace.manifest["draft"], draft_folder(setup), "draft")


# ---------------------------------------------------------------- verdicts
def _token_verdicts(trace: Trace, i: int, tokens: list[int], logprobs, threshold: float) -> list[StepVerdict]:
    out = []
    rec = trace.steps[i]
    for k, s in enumerate(rec):
        if k >= len(tokens):
            out.append(StepVerdict(i, k, Verdict.CONTROL, f"the replay stopped after {len(tokens)} tokens, "
                                                    f"the trace has {len(rec)}"))
            break
        bits = f32_bits(float(logprobs[k]))
        if tokens[k] != s["token"]:
            margin = f32_from_bits(s["margin_bits"]) if s.get("margin_bits") else None
            near = margin is not None and margin < threshold       # no recorded margin: never a near-tie
            why = ("no recorded margin" if margin is None else
                   f"recorded margin {margin:.3g}{' < ' if near else ' >= '}{threshold:g}")
            out.append(StepVerdict(i, k, Verdict.NEAR_TIE if near else Verdict.TOKEN,
                                   f"token {tokens[k]}, the trace has {s['token']} ({why})"))
            break                                           # later steps follow another sequence
        if bits != s["logprob_bits"]:
            d = abs(float(logprobs[k]) - f32_from_bits(s["logprob_bits"]))
            out.append(StepVerdict(i, k, Verdict.BITS, f"logprob {bits} vs the trace's {s['logprob_bits']} "
                                                 f"(|Δ| {d:.3g}, {ulp_distance(bits, s['logprob_bits'])} ULP)",
                                   d, ulp_distance(bits, s["logprob_bits"])))
        else:
            out.append(StepVerdict(i, k, Verdict.BITWISE))
    if len(tokens) > len(rec) and (not out or out[-1].status == Verdict.BITWISE):
        out.append(StepVerdict(i, len(rec), Verdict.CONTROL, f"the replay went on to {len(tokens)} tokens, the trace "
                                                       f"stopped at {len(rec)}"))
    return out


def _speculative_control(trace: Trace, i: int, result, log: StepLog) -> StepVerdict | None:
    """The first round whose draft tree or accept length differs from the trace's, as a verdict
    at the first token that round emits."""
    emitted = 1
    for r, rec in enumerate(trace.rounds[i], 1):
        ev = log.events.get((i, r), {})
        got = result.accept_lengths[r - 1] if r - 1 < len(result.accept_lengths) else None
        if got != rec["accept_length"]:
            return StepVerdict(i, emitted, Verdict.CONTROL, f"verify round {r}: accept length {got}, the trace has "
                                                      f"{rec['accept_length']}")
        if ev.get("draft.tokens") != rec["draft_tokens"] or ev.get("draft.parents") != rec["draft_parents"]:
            return StepVerdict(i, emitted, Verdict.CONTROL, f"verify round {r}: another draft tree "
                                                      f"({ev.get('draft.tokens')} vs {rec['draft_tokens']})")
        emitted += rec["accept_length"]
    return None


# a teacher-forced step whose logprob is bitwise but whose trace lacks a measurement the replay made:
# the text by (no routed experts in the trace, no logits digest in the trace)
_UNCHECKED = {(no_experts, no_digest): "the chosen logprob is bitwise; the trace has no " + " and no ".join(
    what for what, absent in (("routed experts", no_experts), ("logits row's digest", no_digest)) if absent) +
    ": not checked" for no_experts, no_digest in ((True, False), (False, True), (True, True))}


def _forced_verdicts(trace: Trace, i: int, result, flog: StepLog) -> list[StepVerdict]:
    out = []
    lps = result.logprobs.tolist() if hasattr(result.logprobs, "tolist") else list(result.logprobs)  # one copy
    rec = trace.steps[i]
    all_bits = f32_bits_all(lps[:len(rec)])
    for k, s in enumerate(rec):
        bits, rec_experts, rec_digest = all_bits[k], s.get("experts"), s.get("logits_sha256")
        # what this replay measured beyond the logprob (nothing unless the StepLog was asked)
        digest = flog.logits[i, k].get("logits_sha256") if (i, k) in flog.logits else None
        routed = flog.experts.get((i, k))
        experts = [v for _, v in sorted(routed.items())] if routed else []
        if bits != s["logprob_bits"]:
            d = abs(float(lps[k]) - f32_from_bits(s["logprob_bits"]))
            u = ulp_distance(bits, s["logprob_bits"])
            out.append(StepVerdict(i, k, Verdict.BITS, f"logprob {bits} vs the trace's {s['logprob_bits']} "
                                                       f"(|Δ| {d:.3g}, {u} ULP)", d, u))
        elif rec_experts and experts != rec_experts:
            layer = next((j for j, (a, b) in enumerate(zip(experts, rec_experts)) if a != b),
                         min(len(experts), len(rec_experts)))
            out.append(StepVerdict(i, k, Verdict.CONTROL, f"routing: layer {layer} routes to "
                                                          f"{experts[layer] if layer < len(experts) else None}, "
                                                          f"the trace to {(rec_experts + [None])[layer]}"))
        elif rec_digest and digest != rec_digest:
            out.append(StepVerdict(i, k, Verdict.BITS, "the logits row's digest differs (the chosen logprob is equal)"))
        elif not rec_digest or (experts and not rec_experts):
            # a measurement the trace lacks is named, never taken as agreement ([] is "no layer
            # routed" only when the replay routed none either)
            out.append(StepVerdict(i, k, Verdict.NOT_RECORDED, _UNCHECKED[bool(experts) and not rec_experts,
                                                                          not rec_digest]))
        else:
            out.append(StepVerdict(i, k, Verdict.BITWISE))
    return out


def foreign(trace: Trace) -> bool:
    """A trace of another engine (a peer's import, a target's recording): judged with a tolerance.
    Lockstep's own engine recorded through its target adapter is not another engine."""
    return trace.manifest.get("source") not in ("lockstep", "target:lockstep")


def replay(trace: Trace, mode: str = "free-run", overrides: dict | None = None, *, near_tie: float = NEAR_TIE,
           locate_first: bool = True, threshold: float = THRESHOLD, clip: float = 0.2,
           dp: int | None = None) -> ReplayReport:
    """The trace run again as `mode` says and judged step by step. `dp`: data-parallel ranks the
    requests spread over (harness.replay.spread.degree; None: 1, or torchrun's world); the report
    does not depend on it."""
    if mode not in MODES:
        raise TraceError(f"mode must be one of {MODES}, got {mode!r}")
    if not (isinstance(threshold, (int, float)) and math.isfinite(threshold) and threshold > 0):
        raise TraceError(f"threshold must be a finite number > 0, got {threshold!r}")
    if mode == "free-run":
        other = next((r for r in trace.requests if r.get("rng") not in REPLAYABLE_RNG), None)
        if other is not None:
            raise TraceError(f"request {other.get('index')} of this {trace.manifest.get('source')} trace was sampled "
                             f"with RNG {other.get('rng')!r}, not Lockstep's coin contract: it can only be "
                             f"teacher-forced (--mode teacher-forced)")
    setup = replay_setup(trace, overrides or {})
    dp = degree(dp, setup.tp, setup.ep)
    check_identity(trace, setup)
    requests = requests_of(trace)
    shown = {k: getattr(setup, k) for k in OVERRIDABLE if getattr(setup, k) is not None
             and (k not in ("device", "dtype") or (overrides or {}).get(k) is not None)}   # those two: when given
    report = ReplayReport(mode, shown)
    if not foreign(trace):
        report.notes = replay_notes(trace.manifest, setup)
    tokens = [[s["token"] for s in steps] for steps in trace.steps]
    if mode == "free-run":
        log = StepLog([len(r.prompt) for r in requests])
        results = run(setup, requests, log, dp=dp)
        for i, res in enumerate(results):
            vs = _token_verdicts(trace, i, list(res.tokens), res.logprobs, near_tie)
            if setup.speculative is not None:
                c = _speculative_control(trace, i, res, log)
                if c is not None:
                    vs = [v for v in vs if v.step < c.step] + [c]
            if res.finish_reason != trace.requests[i]["finish_reason"] and all(v.status == Verdict.BITWISE for v in vs):
                vs.append(StepVerdict(i, len(res.tokens) - 1, Verdict.CONTROL, f"finish {res.finish_reason}, the trace "
                                                                         f"{trace.requests[i]['finish_reason']}"))
            report.verdicts += vs
    else:
        flog = processed.forced_log(trace.manifest, [len(r.prompt) for r in requests], tokens)
        results = run(setup, forced_requests(requests, tokens), flog, tokens, dp=dp)
        processed.apply(flog, results)      # a peer that declared processed logprobs: compare those
        for i, res in enumerate(results):
            report.verdicts += _forced_verdicts(trace, i, res, flog)
    report.replayed = [f32_bits_all(_floats(res.logprobs)) for res in results]
    bad = [v for v in report.verdicts if v.status not in (Verdict.BITWISE, Verdict.NOT_RECORDED)]
    if foreign(trace):
        report.threshold = threshold
        report.stats, report.rl = _stats(trace, results, threshold, clip)
        bad = [v for v in bad if not (v.status == Verdict.BITS and v.dlogprob <= threshold)]
        locate_first = False                       # the trace's side is another engine: nothing to re-run
    if bad:
        report.first = min(bad, key=lambda v: (v.step, v.request))
        if locate_first:
            report.located = _locate(trace, setup, requests, tokens, results, report.first, mode)
    return report


def _floats(logprobs) -> list[float]:
    return logprobs.tolist() if hasattr(logprobs, "tolist") else list(logprobs)


def _stats(trace: Trace, results, threshold: float, clip: float = 0.2) -> tuple[dict, dict]:
    """Per-token comparison of the replay with the trace (the steps both have), import-peer's, shared:
    (the |Δ| statistics, {"overall": RL statistics, "per_request": [...]})."""

    rep = Deltas(trace.manifest.get("source", "?"), threshold, clip)
    for steps, res in zip(trace.steps, results):
        rep.add_request(steps, res.logprobs.tolist() if hasattr(res.logprobs, "tolist") else list(res.logprobs))
    stats = rep.stats()
    return {k: v for k, v in stats.items() if k != "rl"}, {"overall": stats.get("rl", {}),
                                                           "per_request": rep.per_request()}


def _locate(trace, setup: Setup, requests, tokens, results, first: StepVerdict, mode: str):
    """lockstep.harness.locate on the first divergence: level 1 from the trace and the replay's results,
    level 2 by re-running that step on both sides with every op traced."""

    spec = setup.speculative is not None and mode == "free-run"
    ref, other = [], []
    for i, steps in enumerate(trace.steps):
        lp = torch.tensor([f32_from_bits(s["logprob_bits"]) for s in steps], dtype=torch.float32)
        acc = [r["accept_length"] for r in trace.rounds[i]] if spec else None
        ref.append(RequestBits(len(requests[i].prompt), tokens[i], lp, None, acc))
        other.append(RequestBits(len(requests[i].prompt), list(results[i].tokens), results[i].logprobs, None,
                                 list(results[i].accept_lengths) if spec else None))
    d = first_divergence(ref, other, sides=("the trace", "the replay"))
    if d is None:                                    # a routing or digest difference only: name it at level 1
        d = Divergence(first.request, first.step, first.step, len(requests[first.request].prompt) + first.step,
                       False, [first.status])
    base = recorded_setup(trace)
    forced = None if mode == "free-run" else tokens
    reqs = requests if forced is None else forced_requests(requests, tokens)

    def rerun(s: Setup):
        pos = (s.order or list(range(len(reqs)))).index(d.request)

        def go(engine_trace):
            run(s, reqs, None, forced, engine_trace=engine_trace)
        return go, pos

    go_ref, i_ref = rerun(base)
    go_other, i_other = rerun(setup)
    return locator.locate(("the trace", "the replay"), d, go_ref, go_other, request_in=(i_ref, i_other))
