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
    expect:                           # all optional; the golden is always compared bitwise
      finish_reasons: [stop, length]
      last_tokens: [509, any]         # the last generated id of each request ("any": not pinned)
      batch_invariant: true           # D2: each request alone, and all in reversed order, give the
                                      #     same tokens, logprob bytes and captured bytes
      prefill_chunks: [1, 7]          # D3: the same with these prefill chunk sizes
      reproducible: true              # D1: a second run gives the same bits

The golden holds, per request i, `tokens_i` (int64), `logprobs_i` (float32: log_softmax of the
raw logits at the chosen token) and `captured_i`, and the token lists and finish reasons as data.
Its platform is this machine's (`cpu-fp32`, …), with `-triton` appended for the Triton backend.
"""

from __future__ import annotations

import torch

from harness.checkpoints import CHECKPOINT, model_for
from harness.intseq import IntSeq, materialize
from harness.result import Result
from harness.schema import Bool, Field, Float, Int, List, Map, OneOf, Problem, Str
from engine.generate import Request, generate
from engine.sampling import SamplingParams

NAME = "generate"

SAMPLING = Map({
    "temperature": Field(Float(), default=1.0),
    "top_k": Field(Int(min=0), default=0),
    "top_p": Field(Float(), default=1.0),
    "min_p": Field(Float(), default=0.0),
    "max_new_tokens": Field(Int(min=1), default=16),
    "greedy": Field(Bool(), default=False),
    "stop_token_ids": Field(List(Int(min=0))),
})
REQUEST = Map({
    "prompt": Field(IntSeq(min_value=0), required=True),
    "seed": Field(Int(min=-(2**63), max=2**64 - 1), doc="seeded sampling; without it, greedy is required"),
    "sampling": Field(SAMPLING, default=dict),
})
INPUTS = Map({
    "checkpoint": Field(CHECKPOINT, required=True),
    "requests": Field(List(REQUEST, min_len=1), required=True),
    "capture": Field(List(Int(min=0))),
    "schedule": Field(Map({
        "max_batch": Field(Int(min=1), default=8),
        "prefill_chunk": Field(Int(min=1)),
    }), default=dict),
})
EXPECT = Map({
    "finish_reasons": Field(List(Str(choices=["stop", "length"]))),
    "last_tokens": Field(List(OneOf(Int(min=0), Str(choices=["any"])))),
    "batch_invariant": Field(Bool(), default=False),
    "prefill_chunks": Field(List(Int(min=1), min_len=1)),
    "reproducible": Field(Bool(), default=False),
})


def _params(sampling: dict) -> SamplingParams:
    s = dict(sampling)
    if s.get("stop_token_ids") is not None:
        s["stop_token_ids"] = tuple(s["stop_token_ids"])
    return SamplingParams(**{k: v for k, v in s.items() if v is not None or k == "stop_token_ids"})


def validate(doc: dict) -> list[Problem]:
    inp, exp, out = doc["inputs"], doc["expect"] or {}, []
    for i, req in enumerate(inp["requests"]):
        try:
            params = _params({**SAMPLING.check({}, (), []), **(req["sampling"] or {})})
        except ValueError as e:  # the engine's own validation names the field
            out.append(Problem(("inputs", "requests", i, "sampling"), str(e)))
            continue
        if req["seed"] is None and not params.is_greedy:
            out.append(Problem(("inputs", "requests", i), "a sampled request needs a 'seed' to be reproducible "
                                                          "(or set sampling.greedy: true)"))
    n = len(inp["requests"])
    for key in ("finish_reasons", "last_tokens"):
        if exp.get(key) is not None and len(exp[key]) != n:
            out.append(Problem(("expect", key), f"expected {n} entries, one per request, found {len(exp[key])}"))
    return out


def golden_platform(spec, ctx) -> str:
    return ctx.platform.name + ("" if ctx.backend == "torch" else f"-{ctx.backend}")


def _requests(spec) -> list[Request]:
    return [Request(prompt=materialize(r["prompt"]).tolist(), params=_params(r["sampling"]), seed=r["seed"])
            for r in spec.inputs["requests"]]


def _run(model, requests, capture, schedule, prefill_chunk="schedule"):
    chunk = schedule.get("prefill_chunk") if prefill_chunk == "schedule" else prefill_chunk
    return generate(model, requests, capture=capture or (), max_batch=schedule.get("max_batch") or 8,
                    prefill_chunk=chunk)


def _bytes(result) -> tuple:
    """Everything of one request's result that must be bit-identical, as comparable bytes."""
    cap = result.captured.contiguous().view(torch.uint8).numpy().tobytes() if result.captured is not None else b""
    return (tuple(result.tokens), result.logprobs.contiguous().view(torch.uint8).numpy().tobytes(), cap)


def run(spec, ctx) -> Result:
    inp, exp = spec.inputs, spec.expect
    model = model_for(inp["checkpoint"], ctx.backend)
    requests = _requests(spec)
    capture, schedule = inp["capture"], inp["schedule"] or {}
    results = _run(model, requests, capture, schedule)
    tensors, data = {}, {"tokens": [r.tokens for r in results], "finish_reasons": [r.finish_reason for r in results]}
    for i, r in enumerate(results):
        tensors[f"tokens_{i}"] = torch.tensor(r.tokens, dtype=torch.int64)
        tensors[f"logprobs_{i}"] = r.logprobs
        if r.captured is not None:
            tensors[f"captured_{i}"] = r.captured
    reference = [_bytes(r) for r in results]
    variants = {}
    if exp.get("reproducible"):
        variants["a second run"] = _run(model, requests, capture, schedule)
    if exp.get("batch_invariant"):
        alone = [_run(model, [req], capture, schedule)[0] for req in requests]
        variants["each request alone"] = alone
        variants["reversed order"] = _run(model, requests[::-1], capture, schedule)[::-1]
    for chunk in exp.get("prefill_chunks") or []:
        variants[f"prefill chunks of {chunk}"] = _run(model, requests, capture, schedule, prefill_chunk=chunk)
    data["variants_differing"] = {name: [i for i, r in enumerate(res) if _bytes(r) != reference[i]]
                                  for name, res in variants.items()}
    return Result(tensors=tensors, data=data)


def check(spec, result: Result) -> list[str]:
    exp, data, fails = spec.expect, result.data, []
    if exp.get("finish_reasons") is not None and data["finish_reasons"] != exp["finish_reasons"]:
        fails.append(f"finish reasons {data['finish_reasons']}, the spec expects {exp['finish_reasons']}")
    for i, want in enumerate(exp.get("last_tokens") or []):
        got = data["tokens"][i][-1] if data["tokens"][i] else None
        if want != "any" and got != want:
            fails.append(f"request {i} ended on token {got}, the spec expects {want}")
    for name, differing in data["variants_differing"].items():
        if differing:
            fails.append(f"{name}: requests {differing} gave different tokens, logprob bytes or captured states")
    return fails
