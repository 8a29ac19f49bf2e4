"""Spec kind `replay`: a recorded trace with a known divergence gets the verdict report it must (DESIGN §10).

    kind: replay
    description: …
    inputs:
      checkpoint: {path: models/tiny-target}             # what the trace is recorded on
      requests: [{prompt: [20, 21, 22], seed: 11, sampling: {temperature: 0.9, max_new_tokens: 4}}]
      draft: {path: models/tiny-eagle3, convention: sglang}     # optional, with speculative:
      speculative: {num_steps: 3, topk: 2, draft_token_num: 6, verify: target-only}
      mode: free-run                                     # or teacher-forced
      near_tie: 0.001                                    # optional: replay's --near-tie
      threshold: 0.001                                   # optional: another engine's |Δlogprob| tolerance
      edits:                                             # the known divergence, applied to the recording
        - {request: 0, step: 2, field: logprob, ulp: 3}  # the trace's logprob 3 float32 steps away
      promote: true                                      # optional: also the spec promote writes from it
    expect:
      ok: false                                          # the report's verdict (exit 0 or 1)
      counts: {bitwise: 3, bits: 1}                      # steps per verdict
      first: {request: 0, step: 2, status: bits, ulp: 3}     # the first divergence (or null)
      refused: "another checkpoint"                      # or: the replay must refuse, with these words

The run records the trace by running the engine (fp32, torch ops, on the check's device; the
golden is under the device's fp32 folder, once per device) (harness.replay.record: never hand-written
numbers), applies the edits to what was recorded (each moves one recorded value, so the
divergence is known by construction), writes and reads the trace back (the format's hash chain)
and replays it (harness.replay.rerun, nothing located). The golden holds the whole verdict
report as data (every step's verdict and detail, the statistics of another engine's trace, the
refusal), so any change in how a verdict is chosen, ordered, worded or measured shows as a
mismatch; the expectations say what the report must mean, so a golden recorded from a wrong
verdict cannot pass. `promote: true` also pins the spec `lockstep promote` would write, and
checks its requests read back (as the generate kind reads them) to the trace's own requests.

A peer spec (what `lockstep promote` writes from another engine's trace: an import-peer rollout
or a `record --target` run) holds that engine's tokens and logprobs instead of recording a run:

    inputs:
      checkpoint: {preset: tiny, seed: 0, format: bf16}
      requests: [{prompt: [30, 31], sampling: {greedy: true, max_new_tokens: 2, stop_token_ids: []}}]
      mode: teacher-forced                               # required: the peer's RNG is its own
      peer:
        source: rollouts                                 # the trace's source (import format or target:NAME)
        logprobs: {kind: raw, temperature: 1.0, top_p: 1.0}   # what the peer's logprobs are
        tokens: [[7, 99]]                                # per request: the peer's token ids, forced here
        logprob_bits: [[bf8a3d70, c0a00000]]             # per request: its logprobs, float32 hex

The run teacher-forces the peer's tokens through Lockstep's engine (fp32, torch ops, the check's
device); the golden holds the verdict report and Lockstep's own logprob bits per request, so a
change in the reference's teacher-forced logprobs shows as a mismatch, and `expect` pins the
verdict (which tokens lie over `threshold`). A peer spec takes no edits and no draft.

Edit fields: on a step (`request`, `step`): `logprob` (`ulp: n` or `add: x`), `token` (`add`),
`margin` (`ulp`, `add` or `drop`), `experts` (`add`: layer 0's first expert, or `drop`),
`logits_sha256` (`drop`, or `add`: another digest); on a verify round (`request`, `round`):
`accept_length` (`add`), `draft_tokens` (`add`: the first drafted token); on a request:
`finish_reason` (`set`); on the trace: `source` (`set`: another engine's trace, e.g. "target:peer"),
`checkpoint` (`add`: another digest of its first weight tensor, as another checkpoint would give).
"""

from __future__ import annotations

import hashlib
import math
import tempfile
from pathlib import Path

from lockstep.harness.checkpoints import CHECKPOINT, DRAFT, checkpoint_config
from lockstep.harness.intseq import materialize, max_value
from lockstep.harness.kinds.generate import REQUEST, SAMPLING, _params, _validate_requests, project_root
from lockstep.harness.kinds.generate import INPUTS as GENERATE_INPUTS
from lockstep.harness.replay.format import TraceError, canonical, f32_bits, f32_from_bits, read_trace, write_trace
from lockstep.harness.replay.peer import spec_trace
from lockstep.harness.replay.processed import KINDS as PROCESSING_KINDS, Processing
from lockstep.harness.replay.promote import spec_document
from lockstep.harness.replay.rerun import MODES, NEAR_TIE, THRESHOLD, Verdict, replay, requests_of
from lockstep.harness.target import TargetInterface
from lockstep.harness.result import SpecResult
from lockstep.harness.schema import Any_, Bool, Field, Float, Int, List, Map, Problem, Schema, Str
from lockstep.engine.generate import Request

NAME = "replay"
STEP_FIELDS = ("logprob", "token", "margin", "experts", "logits_sha256")
ROUND_FIELDS = ("accept_length", "draft_tokens")
TRACE_FIELDS = ("finish_reason", "source", "checkpoint")
MAX_ULP = 1 << 24         # float32 steps an edit may move a value: far beyond any divergence worth pinning
MAX_ADD = 1e6             # |add| of an edit: token ids, experts and lengths are far smaller

EDIT = Map({
    "field": Field(Str(choices=list(STEP_FIELDS + ROUND_FIELDS + TRACE_FIELDS)), required=True),
    "request": Field(Int(min=0)),
    "step": Field(Int(min=0)),
    "round": Field(Int(min=1)),
    "ulp": Field(Int(min=-MAX_ULP, max=MAX_ULP)),
    "add": Field(Float(min=-MAX_ADD, max=MAX_ADD)),
    "drop": Field(Bool(), default=False),
    "set": Field(Any_()),
})
PEER = Map({
    "source": Field(Str(), required=True, doc="the engine the values came from (a trace's source)"),
    "logprobs": Field(Map({"kind": Field(Str(choices=list(PROCESSING_KINDS)), default="raw"),
                           "temperature": Field(Float(min=0.0), default=1.0),
                           "top_p": Field(Float(min=0.0, max=1.0), default=1.0)}), default=dict),
    "tokens": Field(List(List(Int(min=0), min_len=1), min_len=1, max_len=8), required=True),
    "logprob_bits": Field(List(List(Str()), min_len=1, max_len=8), required=True),
})
INPUTS = Map({
    "checkpoint": Field(CHECKPOINT, required=True),
    "requests": Field(List(REQUEST, min_len=1, max_len=8), required=True),
    "draft": Field(DRAFT),
    "speculative": GENERATE_INPUTS.fields["speculative"],
    "mode": Field(Str(choices=list(MODES)), default="free-run"),
    "near_tie": Field(Float(min=0.0), default=NEAR_TIE),
    "threshold": Field(Float(min=0.0), default=THRESHOLD),
    "edits": Field(List(EDIT, max_len=16), default=list),
    "promote": Field(Bool(), default=False),
    "peer": Field(PEER, doc="another engine's tokens and logprobs, teacher-forced here (promote writes it)"),
})


class _Sparse(Map):
    """A mapping whose absent keys stay absent (an expectation names only what it pins); null when
    `nullable`. `values`: the schema of every value, for keys drawn from `fields`."""

    def __init__(self, fields: dict, nullable: bool = False):
        super().__init__(fields)
        self.nullable = nullable

    def check(self, value, path, problems):
        if value is None and self.nullable:
            return None
        out = super().check(value, path, problems)
        return {k: v for k, v in out.items() if k in value} if isinstance(out, dict) else out


VERDICTS = [v.value for v in Verdict]
COUNTS = _Sparse({v: Field(Int(min=0)) for v in VERDICTS})
FIRST = _Sparse({"request": Field(Int(min=0)), "step": Field(Int(min=0)), "status": Field(Str(choices=VERDICTS)),
                 "ulp": Field(Int())}, nullable=True)
EXPECT = Map({
    "ok": Field(Bool()),
    "counts": Field(COUNTS, doc="steps per verdict, e.g. {bitwise: 5, bits: 1}"),
    "first": Field(FIRST, doc="request, step, status (and optionally ulp) of the first divergence, or null"),
    "refused": Field(Str(), doc="words the replay's refusal must contain"),
})


def validate(doc: dict, root=None) -> list[Problem]:
    inp, exp, out = doc["inputs"], doc["expect"] or {}, []
    if (inp["draft"] is None) != (inp["speculative"] is None):
        out.append(Problem(("inputs",), "draft and speculative go together"))
    out += _validate_requests(inp)
    if inp["peer"] is not None:
        out += _peer_problems(inp)
    for j, e in enumerate(inp["edits"]):
        out += _edit_problems(e, ("inputs", "edits", j), inp)
    config, problems = checkpoint_config(inp["checkpoint"], root, ("inputs", "checkpoint"))
    out += problems
    for i, req in enumerate(inp["requests"] if config is not None else []):
        top = max_value(req["prompt"])
        if top is not None and top >= config.vocab_size:
            out.append(Problem(("inputs", "requests", i, "prompt"), f"token id {top} is outside the checkpoint's "
                                                                    f"vocabulary [0, {config.vocab_size})"))
    for i, ids in enumerate(inp["peer"]["tokens"] if config is not None and inp["peer"] else []):
        if max(ids) >= config.vocab_size:
            out.append(Problem(("inputs", "peer", "tokens", i), f"token id {max(ids)} is outside the checkpoint's "
                                                                 f"vocabulary [0, {config.vocab_size})"))
    if "refused" in exp and exp["refused"] is not None and any(exp.get(k) is not None for k in ("ok", "counts")):
        out.append(Problem(("expect",), "a refused replay has no verdicts: expect refused, or ok/counts/first"))
    return out


def _peer_problems(inp: dict) -> list[Problem]:
    """A peer spec: teacher-forced, nothing recorded to edit, one token list and one logprob list of
    equal length per request, as long as the request's max_new_tokens; logprobs that are float32
    log-probabilities."""
    where, peer = ("inputs", "peer"), inp["peer"]
    out = [Problem(("inputs", k), f"a peer spec takes no {k} (it holds the peer's values, nothing is recorded)")
           for k in ("edits", "draft") if inp[k]]
    if inp["mode"] != "teacher-forced":
        out.append(Problem(("inputs", "mode"), "a peer spec is teacher-forced (the peer's RNG is its own): "
                                               "mode: teacher-forced"))
    if inp["promote"]:
        out.append(Problem(("inputs", "promote"), "a peer spec is already what promote writes"))
    try:
        Processing(**{"kind": "raw", **peer["logprobs"]})
    except ValueError as e:
        out.append(Problem(where + ("logprobs",), str(e).replace("--peer-logprobs", "kind").replace("--", "")))
    n = len(inp["requests"])
    for name in ("tokens", "logprob_bits"):
        if len(peer[name]) != n:
            out.append(Problem(where + (name,), f"{len(peer[name])} list(s) for the spec's {n} request(s)"))
    for i, (ids, bits) in enumerate(zip(peer["tokens"], peer["logprob_bits"])):
        steps = ((inp["requests"][i]["sampling"] or {}).get("max_new_tokens")
                 or SAMPLING.check({}, (), [])["max_new_tokens"]) if i < n else len(ids)
        if not len(ids) == len(bits) == steps:
            out.append(Problem(where + ("tokens", i), f"request {i}: {len(ids)} token(s), {len(bits)} logprob(s), "
                                                      f"max_new_tokens {steps}: all three must agree"))
        for k, b in enumerate(bits):
            lp = _bits_value(b)
            if lp is None or math.isnan(lp) or lp > 0:
                out.append(Problem(where + ("logprob_bits", i, k), f"{b!r} is not the float32 hex of a "
                                                                   f"log-probability (8 hex digits, <= 0)"))
    return out


def _bits_value(bits: str) -> float | None:
    if not isinstance(bits, str) or len(bits) != 8:
        return None
    try:
        return f32_from_bits(bits)
    except ValueError:
        return None


def _edit_problems(e: dict, where: tuple, inp: dict) -> list[Problem]:
    """An edit must name a request, step and round that the spec's own requests can record, and
    say how it moves the value in a way that field can be moved."""
    f = e["field"]
    need = ("request", "step") if f in STEP_FIELDS else ("request", "round") if f in ROUND_FIELDS else \
        ("request",) if f == "finish_reason" else ()
    out = [Problem(where, f"an edit of {f} needs {k!r}") for k in need if e[k] is None]
    if sum((e["ulp"] is not None, e["add"] is not None, e["drop"], e["set"] is not None)) != 1:
        out.append(Problem(where, "give exactly one of ulp, add, drop, set"))
    if out:
        return out
    how = "ulp" if e["ulp"] is not None else "add" if e["add"] is not None else "drop" if e["drop"] else "set"
    allowed = {"logprob": ("ulp", "add"), "token": ("add",), "margin": ("ulp", "add", "drop"),
               "experts": ("add", "drop"), "logits_sha256": ("add", "drop"), "accept_length": ("add",),
               "draft_tokens": ("add",), "finish_reason": ("set",), "source": ("set",), "checkpoint": ("add",)}[f]
    if how not in allowed:
        return [Problem(where + (how,), f"an edit of {f} takes {' or '.join(allowed)}, not {how}")]
    if how == "add" and f not in ("logprob", "margin") and e["add"] != int(e["add"]):
        out.append(Problem(where + ("add",), f"an edit of {f} adds a whole number, got {e['add']!r}"))
    if how == "set" and not isinstance(e["set"], str):
        out.append(Problem(where + ("set",), f"an edit of {f} sets a string, got {type(e['set']).__name__}"))
    if "request" in need:
        n = len(inp["requests"])
        if e["request"] >= n:
            return out + [Problem(where + ("request",), f"request {e['request']} is not in the spec's {n} request(s)")]
        steps = ((inp["requests"][e["request"]]["sampling"] or {}).get("max_new_tokens")
                 or SAMPLING.check({}, (), [])["max_new_tokens"])
        if "step" in need and e["step"] >= steps:
            out.append(Problem(where + ("step",), f"step {e['step']} is beyond request {e['request']}'s "
                                                  f"max_new_tokens {steps} (steps count from 0)"))
        if "round" in need and inp["speculative"] is None:
            out.append(Problem(where, f"an edit of {f} needs verify rounds: the spec has no speculative decoding"))
        elif "round" in need and e["round"] > steps:
            out.append(Problem(where + ("round",), f"round {e['round']} is beyond request {e['request']}'s "
                                                   f"max_new_tokens {steps} (each round commits a token)"))
    return out


def golden_platform(spec, ctx) -> str:
    return ctx.fixed_platform              # the verdict logic is pinned, on one dtype policy and backend


def run(spec, ctx, target: TargetInterface) -> SpecResult:
    """Replay's verdict logic on a trace the target's `record_trace` gives (Lockstep's engine: fp32,
    torch ops, any device; no other target records one: n/a there)."""
    record_trace = target.op("record_trace", str(ctx.device), why=f"kind {NAME!r} has no target runner")
    inp = spec.inputs
    if inp["peer"] is not None:             # nothing to record: the peer's values, replayed on Lockstep's engine
        return judge(spec, spec_trace(inp, str(ctx.device)))
    return judge(spec, record_trace(inp["checkpoint"], requests(spec), inp["draft"], inp["speculative"]))


def requests(spec) -> list[Request]:
    return [Request(materialize(r["prompt"]).tolist(), _params({**SAMPLING.check({}, (), []), **(r["sampling"] or {})}), r["seed"])
            for r in spec.inputs["requests"]]


def judge(spec, trace) -> SpecResult:
    """Edit the recorded `trace`, write it and read it back, replay it; the report is the result."""
    inp = spec.inputs
    for j, e in enumerate(inp["edits"]):
        try:
            apply_edit(trace, e)
        except IndexError:              # validate bounds edits by max_new_tokens; a stop token ends sooner
            r = e["request"]
            raise ValueError(f"inputs.edits[{j}]: the recording has no {e['field']} at request {r}, "
                             f"{'round ' + str(e['round']) if e['field'] in ROUND_FIELDS else 'step ' + str(e['step'])}"
                             f" (request {r} recorded {len(trace.steps[r])} step(s), "
                             f"{len(trace.rounds[r]) if trace.rounds else 0} round(s))") from None
    root = str(project_root(spec))         # goldens must not depend on where the suite is checked out
    data: dict = {"refused": None, "report": None, "promoted": None}
    facts: dict = {"promote_problems": []}
    with tempfile.TemporaryDirectory(prefix="lockstep-replay-") as tmp:
        trace = read_trace(write_trace(trace, Path(tmp) / "edited.jsonl"))
    try:
        report = replay(trace, inp["mode"], near_tie=inp["near_tie"], threshold=inp["threshold"], locate_first=False)
        data["report"] = {**report.to_json(), "text": report.text().replace(root, "<suite>")}
        if inp["peer"] is not None:         # every step's bits, beyond the report's first 200 divergent steps
            data["lockstep_logprob_bits"] = report.replayed
    except TraceError as e:
        data["refused"] = str(e).replace(root, "<suite>")
    if inp["promote"]:
        doc = spec_document(trace, list(range(len(trace.requests))), "promoted by a replay spec")
        data["promoted"] = doc
        facts["promote_problems"] = promote_problems(trace, doc)
    return SpecResult(data=data, facts=facts)


def promote_problems(trace, doc: dict) -> list[str]:
    """Each promoted request must read back (as the generate kind reads a spec) to the trace's."""
    out = []
    for i, (want, item) in enumerate(zip(requests_of(trace), doc["inputs"]["requests"])):
        got = Request(item["prompt"], _params({**SAMPLING.check({}, (), []), **item["sampling"]}), item.get("seed"))
        if (got.prompt, got.params, got.seed) != (list(want.prompt), want.params, want.seed):
            out.append(f"promote: request {i} reads back as {got}, the trace has {want}")
    return out


# ---------------------------------------------------------------- the known divergences
def _moved(bits: str, e: dict) -> str:
    """The float32 `ulp` values up (toward +inf; down when negative) on replay's ULP line, or + `add`."""
    if e["ulp"] is None:
        return f32_bits(f32_from_bits(bits) + e["add"])
    u = int(bits, 16)
    line = (-(u & 0x7FFFFFFF) if u & 0x80000000 else u) + e["ulp"]
    return f"{(0x80000000 | -line) if line < 0 else line:08x}"


def apply_edit(trace, e: dict) -> None:
    f = e["field"]
    if f in STEP_FIELDS:
        _edit_step(trace.steps[e["request"]][e["step"]], e)
    elif f in ROUND_FIELDS:
        rnd = trace.rounds[e["request"]][e["round"] - 1]
        if f == "accept_length":
            rnd[f] += int(e["add"])
        else:
            rnd[f] = [rnd[f][0] + int(e["add"])] + rnd[f][1:]
    elif f == "finish_reason":
        trace.requests[e["request"]][f] = e["set"]
    elif f == "source":
        trace.manifest[f] = e["set"]
    else:                                      # checkpoint: another first tensor, its whole digest recomputed
        ck = trace.manifest["checkpoint"]
        name = sorted(ck["tensors"])[0]
        ck["tensors"][name] = hashlib.sha256(ck["tensors"][name].encode()).hexdigest()
        ck["sha256"] = hashlib.sha256(canonical({"config": ck["config_sha256"], "tensors": ck["tensors"]})).hexdigest()


def _edit_step(s: dict, e: dict) -> None:
    f = e["field"]
    if f == "logprob":
        s["logprob_bits"] = _moved(s["logprob_bits"], e)
        s["logprob"] = f32_from_bits(s["logprob_bits"])
    elif f == "token":
        s["token"] += int(e["add"])
    elif f == "margin":
        s["margin_bits"] = None if e["drop"] else _moved(s["margin_bits"], e)
        s["margin"] = None if e["drop"] else f32_from_bits(s["margin_bits"])
    elif f == "experts":
        s["experts"] = [] if e["drop"] else [[s["experts"][0][0] + int(e["add"])] + s["experts"][0][1:]] + \
            s["experts"][1:]
    else:
        s["logits_sha256"] = None if e["drop"] else hashlib.sha256(s["logits_sha256"].encode()).hexdigest()


# ---------------------------------------------------------------- what the report must mean
def check(spec, result: SpecResult) -> list[str]:
    exp, data = spec.expect or {}, result.data
    fails = list(result.facts["promote_problems"])
    if exp.get("refused") is not None:
        if data["refused"] is None or exp["refused"] not in data["refused"]:
            fails.append(f"the replay must refuse with {exp['refused']!r}; it "
                         + (f"refused with {data['refused']!r}" if data["refused"] else "ran"))
        return fails
    if data["refused"] is not None:
        return fails + [f"the replay refused: {data['refused']}"]
    rep = data["report"]
    if exp.get("ok") is not None and rep["ok"] != exp["ok"]:
        fails.append(f"the report's ok is {rep['ok']}, the spec expects {exp['ok']}")
    if exp.get("counts") is not None and rep["counts"] != exp["counts"]:
        fails.append(f"verdict counts {rep['counts']}, the spec expects {exp['counts']}")
    want, got = exp.get("first"), rep["first"]          # no first divergence at all is `ok: true`
    if want is not None:
        if got is None or any(got.get(k) != v for k, v in want.items()):
            fails.append(f"first divergence {_brief(got)}, the spec expects {want}")
    return fails


def _brief(v) -> str:
    return "none" if v is None else str({k: v[k] for k in ("request", "step", "status", "ulp")})
