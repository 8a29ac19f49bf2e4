"""Spec kind `generate`: end-to-end generations of the reference engine, pinned bit for bit.

    kind: generate
    description: …
    inputs:
      checkpoint: {preset: tiny, seed: 0, format: bf16}   # synthetic, HF layout (harness.checkpoints)
      requests:
        - prompt: {hashed: {count: 40, seed: 1, below: 500}}   # token ids (IntSeq)
          seed: 7                                             # optional: seeded sampling
          sampling: {temperature: 0.8, top_k: 20, top_p: 0.9, min_p: 0.05,
                     max_new_tokens: 16, greedy: false, stop_token_ids: [5, 6]}
      capture: [2, 4]                 # optional: boundaries captured at every position
      schedule: {max_batch: 8, prefill_chunk: 16}   # how the batch is run (default: all at once)
      topologies: [[2, 1], [1, 2]]    # optional: also run at these (tp, ep) over torch.distributed;
                                      # each must give the one-device bits (D4), and with a draft
                                      # (draft replicated per rank) the same accept lengths too
      draft: {path: models/tiny-eagle3, convention: sglang}   # optional: EAGLE3 speculative decoding
      speculative: {num_steps: 3, topk: 2, draft_token_num: 6, verify: target-only,
                    threshold_single: 1.0, threshold_acc: 1.0}
    expect:                           # all optional; the golden is always compared bitwise
      finish_reasons: [stop, length]
      last_tokens: [509, any]         # the last generated id of each request ("any": not pinned)
      batch_invariant: true           # D2: each request alone, and all in reversed order, give the
                                      #     same tokens, logprob bytes and captured bytes
      prefill_chunks: [1, 7]          # D3: the same with these prefill chunk sizes
      reproducible: true              # D1: a second run gives the same bits
      equals_plain: true              # speculative: same tokens and logprob bytes as plain generate
      min_mean_accept: 1.5            # speculative: mean accept length over requests and rounds

The golden holds, per request i, `tokens_i` (int64), `logprobs_i` (float32: log_softmax of the
raw logits at the chosen token), `captured_i` and, speculative, `accept_lengths_i` (accepted
drafts + 1 per verify round), and the token lists and finish reasons as data. Checkpoint and
draft paths are relative to the project root (the folder holding `specs/`).
Its platform is this machine's (`cpu-fp32`, …), with `-triton` appended for the Triton backend.

Every comparison that fails (a variant above, or the golden) is located (harness.locate): the
first request, step and token that differ; for a variant, also the first layer and op, from a
traced re-run of that step on both sides (SpecResult.located).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, NamedTuple

import torch

from lockstep.engine.distributed import Topology
from lockstep.engine.request import Request, Result as Generation, SamplingParams
from lockstep.engine.speculative import SpecParams
from lockstep.harness.checkpoints import (CHECKPOINT, DRAFT, checkpoint_config, checkpoint_problems, draft_dir,
                                          draft_problems, draft_tie_problems, reference_model, target_dir)
from lockstep.harness.intseq import IntSeq, length, materialize, max_value
from lockstep.harness.limits import MAX_DRAFT_STEPS, MAX_DRAFT_TOKENS, MAX_DRAFT_TOPK, MAX_REQUEST_TOKENS, MAX_REQUESTS
from lockstep.harness.locate import Located, RequestBits, first_divergence, locate
from lockstep.harness.result import SpecResult
from lockstep.harness.schema import Bool, Field, Float, Int, List, Map, OneOf, Problem, Str
from lockstep.harness.target import CALIBRATED, TOLERANCE, NotApplicable, TargetInterface

NAME = "generate"

SAMPLING = Map({
    "temperature": Field(Float(), default=1.0),
    "top_k": Field(Int(min=0), default=0),
    "top_p": Field(Float(), default=1.0),
    "min_p": Field(Float(), default=0.0),
    "max_new_tokens": Field(Int(min=1, max=MAX_REQUEST_TOKENS), default=16),
    "greedy": Field(Bool(), default=False),
    "stop_token_ids": Field(List(Int(min=0))),
})
REQUEST = Map({
    "prompt": Field(IntSeq(min_value=0, max_len=MAX_REQUEST_TOKENS), required=True),
    "seed": Field(Int(min=-(2**63), max=2**64 - 1), doc="seeded sampling; without it, greedy is required"),
    "sampling": Field(SAMPLING, default=dict),
})
INPUTS = Map({
    "checkpoint": Field(CHECKPOINT, required=True),
    "requests": Field(List(REQUEST, min_len=1, max_len=MAX_REQUESTS), required=True),
    "capture": Field(List(Int(min=0))),
    "schedule": Field(Map({
        "max_batch": Field(Int(min=1), default=8),
        "prefill_chunk": Field(Int(min=1)),
    }), default=dict),
    "topologies": Field(List(List(Int(min=1, max=8), min_len=2, max_len=2), min_len=1),
                        doc="(tp, ep) pairs that must reproduce the one-device bits"),
    "draft": Field(DRAFT, doc="an EAGLE3 draft; with `speculative`"),
    "speculative": Field(Map({
        "num_steps": Field(Int(min=1, max=MAX_DRAFT_STEPS), default=3),
        "topk": Field(Int(min=1, max=MAX_DRAFT_TOPK), default=1),
        "draft_token_num": Field(Int(min=1, max=MAX_DRAFT_TOKENS), default=4),
        "verify": Field(Str(choices=["greedy", "target-only", "rejection"]), default="target-only"),
        "threshold_single": Field(Float(), default=1.0),
        "threshold_acc": Field(Float(), default=1.0),
    })),
})
EXPECT = Map({
    "finish_reasons": Field(List(Str(choices=["stop", "length"]))),
    "last_tokens": Field(List(OneOf(Int(min=0), Str(choices=["any"])))),
    "batch_invariant": Field(Bool(), default=False),
    "prefill_chunks": Field(List(Int(min=1), min_len=1)),
    "reproducible": Field(Bool(), default=False),
    "equals_plain": Field(Bool(), default=False),
    "min_mean_accept": Field(Float()),
})


def _params(sampling: dict) -> SamplingParams:
    """A spec's `sampling` mapping: the trace's form (engine.request.SamplingParams.from_dict)."""
    return SamplingParams.from_dict(sampling)


def validate(doc: dict, root: Path | None = None) -> list[Problem]:
    inp, exp = doc["inputs"], doc["expect"] or {}
    out = _validate_requests(inp)
    out += _validate_speculative(inp, exp)
    n = len(inp["requests"])
    for key in ("finish_reasons", "last_tokens"):
        if exp.get(key) is not None and len(exp[key]) != n:
            out.append(Problem(("expect", key), f"expected {n} entries, one per request, found {len(exp[key])}"))
    config, problems = checkpoint_config(inp["checkpoint"], root, ("inputs", "checkpoint"))
    out += problems + checkpoint_problems(inp["checkpoint"], ("inputs", "checkpoint"), check_preset=False)
    if inp["draft"] is not None:
        out += draft_problems(inp["draft"], inp["checkpoint"], config, root, ("inputs", "draft"))
        out += draft_tie_problems(inp["draft"], inp["checkpoint"], ("inputs", "draft"))
    if config is not None:
        out += _validate_against_config(inp, exp, config)
    return out


def _validate_requests(inp) -> list[Problem]:
    out = []
    for i, req in enumerate(inp["requests"]):
        where = ("inputs", "requests", i)
        try:
            params = _params({**SAMPLING.check({}, (), []), **(req["sampling"] or {})})
        except ValueError as e:  # the engine's own validation names the field
            out.append(Problem(where + ("sampling",), str(e)))
            continue
        if req["seed"] is None and not params.is_greedy:
            out.append(Problem(where, "a sampled request needs a 'seed' to be reproducible "
                                      "(or set sampling.greedy: true)"))
        total = length(req["prompt"]) + params.max_new_tokens
        if total > MAX_REQUEST_TOKENS:
            out.append(Problem(where, f"prompt ({length(req['prompt'])}) + max_new_tokens ({params.max_new_tokens}) "
                                      f"= {total} tokens, more than {MAX_REQUEST_TOKENS} per request"))
    return out


def _validate_speculative(inp, exp) -> list[Problem]:
    out = []
    if (inp["draft"] is None) != (inp["speculative"] is None):
        out.append(Problem(("inputs",), "'draft' and 'speculative' go together"))
    if inp["speculative"] is not None:
        try:
            _spec_params(inp["speculative"])
        except ValueError as e:
            out.append(Problem(("inputs", "speculative"), str(e)))
        if inp["capture"]:
            out.append(Problem(("inputs", "capture"), "not supported with speculative decoding yet", at_key=True))
        if exp.get("prefill_chunks"):
            out.append(Problem(("expect", "prefill_chunks"), "speculative decoding has no chunked prefill yet",
                               at_key=True))
    elif exp.get("equals_plain") or exp.get("min_mean_accept") is not None:
        out.append(Problem(("expect",), "equals_plain and min_mean_accept need speculative decoding"))
    return out


def _validate_against_config(inp, exp, config) -> list[Problem]:
    """Token ids within the checkpoint's vocabulary, captured boundaries within its depth, and
    topologies it can be split over: what the engine would otherwise refuse at run time."""
    V, L = config.vocab_size, config.num_hidden_layers
    out = []
    for i, req in enumerate(inp["requests"]):
        where = ("inputs", "requests", i)
        top = max_value(req["prompt"])
        if top is not None and top >= V:
            out.append(Problem(where + ("prompt",), f"token id {top} is outside the checkpoint's vocabulary "
                                                    f"[0, {V})"))
        for j, t in enumerate((req["sampling"] or {}).get("stop_token_ids") or []):
            if t >= V:
                out.append(Problem(where + ("sampling", "stop_token_ids", j), f"token id {t} is outside the "
                                                                              f"checkpoint's vocabulary [0, {V})"))
    for j, t in enumerate(exp.get("last_tokens") or []):
        if t != "any" and t >= V:
            out.append(Problem(("expect", "last_tokens", j), f"token id {t} is outside the checkpoint's "
                                                             f"vocabulary [0, {V})"))
    for j, b in enumerate(inp["capture"] or []):
        if b > L:
            out.append(Problem(("inputs", "capture", j), f"boundary {b} is outside [0, {L}] (the checkpoint has "
                                                         f"{L} blocks)"))
    if inp["topologies"]:
        for j, (tp, ep) in enumerate(inp["topologies"]):
            problems = Topology(tp, ep).problems(config)
            if problems:
                out.append(Problem(("inputs", "topologies", j), f"the checkpoint cannot be split at tp={tp} ep={ep}: "
                                                                + "; ".join(problems)))
    return out


def golden_platform(spec, ctx) -> str:
    return ctx.engine_platform


def _requests(spec) -> list[Request]:
    """A spec's requests: the trace's form (engine.request.Request.from_dict), the prompt an IntSeq."""
    return [Request.from_dict({**r, "prompt": materialize(r["prompt"]).tolist()}) for r in spec.inputs["requests"]]


def _spec_params(speculative: dict):
    return SpecParams(**speculative)


def project_root(spec) -> Path:
    """The folder holding `specs/`: the spec file's ancestor one level above its id's parts."""
    return Path(spec.file).resolve().parents[len(spec.id.split("/"))]


class _Variant(NamedTuple):
    """A way of running the spec's requests that must give the spec's run's bits.
    `call(requests, trace)` runs those requests (trace: None, or an engine.trace.OpTrace for the
    target) -> their results in order. `order`: all requests in one call ("same"), in reversed
    order ("reversed"), or each in a call of its own ("alone"). `aligned`: its steps are the
    spec's run's steps (not so for plain decoding against speculative)."""
    name: str
    call: Callable
    order: str = "same"
    aligned: bool = True

    def calls(self, n: int) -> list[list[int]]:
        """The request indices of each call, in call order."""
        if self.order == "alone":
            return [[i] for i in range(n)]
        return [list(range(n))[::-1] if self.order == "reversed" else list(range(n))]

    def results(self, requests) -> list:
        """Every request's result, in the spec's order."""
        out = [None] * len(requests)
        for idx in self.calls(len(requests)):
            got = list(self.call([requests[i] for i in idx], None))
            if len(got) != len(idx):
                raise ValueError(f"{self.name}: {len(got)} results for {len(idx)} requests")
            for i, r in zip(idx, got):
                out[i] = r
        return out

    def rerun(self, requests, i: int):
        """(run(trace): the call holding request i again, with `trace`; i's index in that call)."""
        idx = next(c for c in self.calls(len(requests)) if i in c)
        return (lambda trace: self.call([requests[k] for k in idx], trace)), idx.index(i)


def _bytes(result) -> tuple:
    """Everything of one request's result that must be bit-identical, as comparable values:
    (tokens, logprob bytes, captured bytes or None, accept lengths or None); of the engine's
    results and of a target's SpecResult alike."""
    def raw(x):
        return None if x is None else x.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    accept = getattr(result, "accept_lengths", None)
    return (tuple(result.tokens), raw(torch.as_tensor(result.logprobs, dtype=torch.float32)),
            raw(getattr(result, "captured", None)), None if accept is None else tuple(accept))


def _same(a: tuple, b: tuple) -> bool:
    """Same tokens and logprob bytes; same captured states and accept lengths where both runs have
    them (speculative decoding captures none and plain generate has no accept lengths, so the two
    are compared on tokens and logprobs; two speculative runs also on their accept lengths)."""
    return a[:2] == b[:2] and all(x is None or y is None or x == y for x, y in zip(a[2:], b[2:]))


def run(spec, ctx, target: TargetInterface) -> SpecResult:
    """The spec's requests through the target's `generate` (or `greedy_generate`), or with a draft
    its `speculative_generate`; every variant of the spec (and, where the operation offers
    "topology", the spec's topologies and --world-size's) re-run through the same operation,
    bitwise against the target's own run; where it offers "observer", each difference located by
    re-running both sides op by op (harness.locate)."""
    inp, exp = spec.inputs, spec.expect
    own, plain = _generate_plan(spec, target, str(ctx.device))
    requests = _requests(spec)
    spec_run = _Variant("the spec's run", own)
    results = spec_run.results(requests)
    tensors, data = _outputs(results, speculative=inp["draft"] is not None)
    reference = [_bytes(r) for r in results]
    variants, lacking = _variants(spec, target, own, plain)
    topologies, notes = _topology_variants(spec, ctx, target, own)
    variants += topologies
    located = target.offers(_OP[inp["draft"] is not None], "observer")
    differing, first, where = {}, {}, []
    for v in variants:
        got = v.results(requests)
        differing[v.name] = [i for i, r in enumerate(got) if not _same(_bytes(r), reference[i])]
        if differing[v.name]:
            first[v.name] = _first(spec_run, v, requests, results, got)
            if located:
                where.append(_locate(spec_run, v, requests, results, got))
    facts = {"variants_differing": differing, "variants_first": first, "variants_na": lacking,
             "variant_property": {v.name: _property(v.name) for v in variants} | {n: _property(n) for n in lacking}}
    return SpecResult(tensors=tensors, data=data, facts=facts, notes=notes, located=[x for x in where if x is not None])


# The engine property each variant tests (DESIGN §2, §11): a target claims the ones it promises.
PROPERTIES = {"a second run": "run-to-run", "each request alone": "batch", "reversed order": "batch",
              "prefill chunks of": "prefill", "plain (non-speculative) generate": "speculative-greedy",
              "topology": "topology"}


def _property(variant: str) -> str:
    return next(p for prefix, p in PROPERTIES.items() if variant.startswith(prefix))


def _variants(spec, target: TargetInterface, own, plain) -> tuple[list, dict]:
    """(the variants the spec asks for that the target can run, {variant: why n/a} for the rest):
    a variant needing a feature the target's operation lacks is n/a alone, not the whole spec."""
    exp, op = spec.expect, _OP[spec.inputs["draft"] is not None]
    several = len(spec.inputs["requests"]) > 1
    wanted = []
    if exp.get("reproducible"):
        wanted.append((_Variant("a second run", own), ()))
    if exp.get("batch_invariant"):
        wanted += [(_Variant("each request alone", own, "alone"), ()),
                   (_Variant("reversed order", own, "reversed"), ("batch",) if several else ())]
    for chunk in exp.get("prefill_chunks") or []:
        wanted.append((_Variant(f"prefill chunks of {chunk}", lambda reqs, trace, c=chunk: own(reqs, trace, c)),
                       ("prefill_chunk",)))
    if plain is not None:
        wanted.append((_Variant("plain (non-speculative) generate", plain, aligned=False), ()))
    variants, lacking = [], {}
    for v, needs in wanted:
        missing = [n for n in needs if not target.offers(op, n)]
        if missing:
            lacking[v.name] = target.missing.get(f"{op}:{missing[0]}", f"{target.name}'s {op} does not offer "
                                                                       f"{missing[0]!r}")
        else:
            variants.append(v)
    return variants, lacking


def _first(own: _Variant, other: _Variant, requests, results, got) -> str:
    """Where `other` first parts from the spec's run: request, step and the two tokens or bits."""
    lens, sides = [len(r.prompt) for r in requests], (own.name, other.name)
    d = first_divergence([RequestBits.of(r, n) for r, n in zip(results, lens)],
                         [RequestBits.of(r, n) for r, n in zip(got, lens)], sides)
    if d is None:
        return ""
    a, b = list(results[d.request].tokens), list(got[d.request].tokens)
    j = d.token
    shown = f"token {a[j] if j < len(a) else 'none'} vs {b[j] if j < len(b) else 'none'}" if "tokens" in d.what else \
        f"logprob {_lp(results[d.request], j)} vs {_lp(got[d.request], j)}" if "logprob bits" in d.what else ""
    return f"request {d.request} {d.step_name()}: {', '.join(d.what)} differ" + (f" ({shown})" if shown else "")


def _lp(result, j: int) -> str:
    lp = torch.as_tensor(result.logprobs, dtype=torch.float32)
    return f"{float(lp[j]):.9g} (0x{lp[j:j + 1].view(torch.int32).item() & 0xFFFFFFFF:08x})" if j < len(lp) else "none"


_OP = {False: "generate", True: "speculative_generate"}      # with a draft: speculative


def _outputs(results, speculative: bool) -> tuple[dict, dict]:
    """The golden's tensors and data of the spec's own run."""
    tensors, data = {}, {"tokens": [list(r.tokens) for r in results],
                         "finish_reasons": [r.finish_reason for r in results]}
    for i, r in enumerate(results):
        tensors[f"tokens_{i}"] = torch.tensor(list(r.tokens), dtype=torch.int64)
        tensors[f"logprobs_{i}"] = torch.as_tensor(r.logprobs).cpu()
        if getattr(r, "captured", None) is not None:
            tensors[f"captured_{i}"] = torch.as_tensor(r.captured).cpu()
        if speculative:
            tensors[f"accept_lengths_{i}"] = torch.tensor(list(r.accept_lengths or []), dtype=torch.int64)
    if speculative:
        data["mean_accept_length"] = [sum(r.accept_lengths) / len(r.accept_lengths) if r.accept_lengths else 0.0
                                      for r in results]
    return tensors, data


def _topology_variants(spec, ctx, t: TargetInterface, own) -> tuple[list, list[str]]:
    """(a variant per topology the run checks, notes): the spec's (tp, ep) pairs and --world-size's,
    where the target's generation operation offers "topology" (a split of Lockstep's own engine)."""
    inp = spec.inputs
    if not t.offers(_OP[inp["draft"] is not None], "topology"):
        return [], []
    config = reference_model(t, inp["checkpoint"], project_root(spec), str(ctx.device)).config
    plan = t.op("plan_topologies", str(ctx.device))       # the target knows which splits it can run here
    topologies, skipped, transports = plan(config, inp["topologies"] or [], ctx.world_sizes)
    variants = [_Variant(f"topology tp={tp} ep={ep}", lambda reqs, trace, tp=tp, ep=ep: own(reqs, trace, tp=tp, ep=ep))
                for tp, ep in topologies]
    notes = [f"checked at {', '.join(v.name for v in variants)}"] if topologies else []
    return variants, notes + transports + [f"not run at {s}" for s in skipped]


def _plain_call(spec, t: TargetInterface, device: str, sampled: bool):
    """call(requests, trace=None, prefill_chunk="schedule", tp=1, ep=1) -> [Generation] through
    `generate`, or `greedy_generate` for what the minimal loop can run (greedy, no capture, no
    chunking); NotApplicable otherwise."""
    inp, exp = spec.inputs, spec.expect
    schedule = inp["schedule"] or {}
    chunked = schedule.get("prefill_chunk") is not None
    needs = tuple(n for n, on in (("sampling", sampled), ("capture", bool(inp["capture"])),
                                  ("prefill_chunk", chunked)) if on)
    ckpt = target_dir(inp["checkpoint"], project_root(spec))
    if "generate" not in t.ops and "greedy_generate" in t.ops and not needs:
        greedy = t.op("greedy_generate", device)

        def call(requests, trace=None, prefill_chunk="schedule"):
            return [Generation(*greedy(ckpt, r.prompt, r.params.max_new_tokens, r.params.stop_token_ids))
                    for r in requests]
        return call
    gen = t.op("generate", device, needs)
    batched = t.offers("generate", "batch")
    capture = tuple(inp["capture"] or ())
    max_batch = schedule.get("max_batch") or 8

    def call(requests, trace=None, prefill_chunk="schedule", **split):
        chunk = schedule.get("prefill_chunk") if prefill_chunk == "schedule" else prefill_chunk
        kw = {"capture": capture} if capture else {}
        kw |= {"prefill_chunk": chunk} if chunk is not None else {}
        kw |= _hooks(trace, split)
        if batched:
            return list(gen(ckpt, requests, max_batch=max_batch, **kw))
        return [out for r in requests for out in gen(ckpt, [r], max_batch=1, **kw)]
    return call


def _hooks(trace, split: dict) -> dict:
    """The observer and topology keywords of a call, each only where it is asked for."""
    return ({"observer": trace} if trace is not None else {}) | {k: v for k, v in split.items() if v != 1}


def _speculative_call(spec, t: TargetInterface, device: str, sampled: bool):
    inp, exp = spec.inputs, spec.expect
    sp = inp["speculative"]
    mode = sp["verify"] if sampled else "greedy"     # greedy requests are verified greedily (DESIGN §6)
    needs = (mode,) + (("tree",) if sp["topk"] > 1 else ()) + (("sampling",) if sampled else ())
    op = t.op("speculative_generate", device, needs)
    batched = t.offers("speculative_generate", "batch")
    root = project_root(spec)
    args = (target_dir(inp["checkpoint"], root), draft_dir(inp["draft"], inp["checkpoint"], root),
            inp["draft"]["convention"])

    def call(requests, trace=None, prefill_chunk=None, **split):
        kw = _hooks(trace, split)
        if batched:
            return list(op(*args, requests, dict(sp), **kw))
        return [out for r in requests for out in op(*args, [r], dict(sp), **kw)]
    return call


def _generate_plan(spec, t: TargetInterface, device: str):
    """(the spec's own call, the plain call for equals_plain or None); NotApplicable with the reason."""
    inp, exp = spec.inputs, spec.expect
    if inp.get("topologies") and not t.offers(_OP[inp["draft"] is not None], "topology"):
        raise NotApplicable(f"{t.name}: generate specs with 'topologies' split Lockstep's own engine over "
                            f"torch.distributed; a topology is not an operation of a target")
    sampled = any(not r.params.is_greedy for r in _requests(spec))
    if inp["draft"] is not None:
        plain = _plain_call(spec, t, device, sampled) if exp.get("equals_plain") else None
        return _speculative_call(spec, t, device, sampled), plain
    return _plain_call(spec, t, device, sampled), None


def applicability(spec, target: TargetInterface, device: str) -> str:
    _generate_plan(spec, target, device)
    return _how(spec)


def compared(spec, ctx, result: SpecResult) -> tuple[str, str]:
    """Calibrated (harness/targets/agreement.py): tokens free-running to the first divergence
    beyond a near-tie, logprobs teacher-forced within the dtype's bound; the golden platform is
    the reference's at the run's dtype (its captured states are compared to it). Speculative specs
    (whose tokens follow the verify rule, not a per-step draw): tokens exactly, the rest within the
    cross bound."""
    return _how(spec), golden_platform(spec, ctx)


def _how(spec) -> str:
    return CALIBRATED if spec.inputs["draft"] is None else TOLERANCE


def _locate(own: _Variant, other: _Variant, requests, results, got) -> Located | None:
    """Where `other`'s results first part from the spec's run's, re-run op by op (harness.locate)."""
    lens, sides = [len(r.prompt) for r in requests], (own.name, other.name)
    first = first_divergence([RequestBits.of(r, n) for r, n in zip(results, lens)],
                             [RequestBits.of(r, n) for r, n in zip(got, lens)], sides)
    if first is None:
        return None
    if not other.aligned:
        return Located(sides, first, note="not re-run op by op: speculative rounds and plain decode steps "
                                          "do not align")
    (ref_run, i_ref), (other_run, i_other) = own.rerun(requests, first.request), other.rerun(requests, first.request)
    return locate(sides, first, ref_run, other_run, (i_ref, i_other))


def locate_golden(spec, golden_tensors: dict, result_tensors: dict,
                  sides: tuple[str, str] = ("golden", "this run")) -> Located | None:
    """A golden mismatch, located from the golden's per-request tensors (level 1 of harness.locate:
    the golden keeps no op-level states, and its recording code cannot be re-run). Also serves
    two whole runs of the spec that disagree (regen's D1 check), with their `sides`."""
    lens = [len(materialize(r["prompt"])) for r in spec.inputs["requests"]]
    try:
        gold = [RequestBits.from_tensors(golden_tensors, i, n) for i, n in enumerate(lens)]
        ours = [RequestBits.from_tensors(result_tensors, i, n) for i, n in enumerate(lens)]
    except KeyError:                      # a tensor missing on one side: compare's report says which
        return None
    first = first_divergence(gold, ours, sides)
    if first is None:
        return None
    why = "a golden keeps no op-level states" if sides[0] == "golden" else "two whole runs of the spec"
    return Located(sides, first, note=f"not re-run op by op ({why}); to find the op, compare two runs that "
                                      f"must agree: --world-size, or the spec's batch_invariant, "
                                      f"prefill_chunks or reproducible")


def check(spec, result: SpecResult) -> list[str]:
    exp, data, fails = spec.expect, result.data, []
    if exp.get("finish_reasons") is not None and data["finish_reasons"] != exp["finish_reasons"]:
        fails.append(f"finish reasons {data['finish_reasons']}, the spec expects {exp['finish_reasons']}")
    for i, want in enumerate(exp.get("last_tokens") or []):
        got = data["tokens"][i][-1] if data["tokens"][i] else None
        if want != "any" and got != want:
            fails.append(f"request {i} ended on token {got}, the spec expects {want}")
    for name, differing in result.facts["variants_differing"].items():
        if differing:
            fails.append(f"{name}: requests {differing} gave different tokens, logprob bytes, captured states "
                         f"or accept lengths")
    if exp.get("min_mean_accept") is not None:
        mean = sum(data["mean_accept_length"]) / len(data["mean_accept_length"])
        if mean < exp["min_mean_accept"]:
            fails.append(f"mean accept length {mean:.3f} is below the spec's {exp['min_mean_accept']}")
    return fails
