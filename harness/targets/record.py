"""`lockstep record --target NAME`: run the requests through a target adapter and write a trace.

    trace = record_target("hf", Setup({"path": "models/tiny-target"}), requests)

The target (harness/targets/: a built-in adapter or an outside engine's entry point) generates
through its `generate` operation (batches and chunked prefill as its Op.features say; seeded
requests with its own seeded sampling, so they need its declared RNG model, `Target.rng`, not the
`sampling` feature of the coin contract) or, for greedy requests without chunking, its
`greedy_generate`. What it gives back is what
the target interface carries: per request the token ids, each chosen token's logprob and the
finish reason. The trace is in the same format as `lockstep record`'s, with

  - `source: "target:NAME"` and `engine` naming the target, its version, the operation driven and
    its RNG model; `target` in the manifest holds the same with the settings it ran under;
  - per request `rng`: "none (greedy)", or for a seeded request the target's declared model
    (`Target.rng`): "lockstep-coins-1" (DESIGN §5's coin contract) only from Lockstep's own
    target; from any other "target:NAME stateless (seed, position)" or "target:NAME stateful
    (generator)" — a seed that belongs to another RNG, which free-run replay refuses;
  - per step the token and its logprob bits; the margin, logits digest and routed experts are
    null / empty, since no target operation exposes them (replay then does not judge them).

`lockstep replay --mode teacher-forced` feeds such a trace through Lockstep's engine and judges it
with a tolerance and per-token statistics (harness/replay/rerun.py): across implementations,
never a claim of bitwise equality. A target that cannot run here (not installed, no generation
operation, the operation not on this device, a feature missing, sampled requests without an RNG
model) is a TraceError of one line naming what is missing (the CLI exits 2); a crash of the
target's code is one located line too.
"""

from __future__ import annotations

import json
import math

import torch

from lockstep.engine.request import Request, Result
from lockstep.harness.errors import located
from lockstep.harness.replay.format import FORMAT, TRACE_VERSION, Trace, TraceError, f32_bits
from lockstep.harness.replay.identity import checkpoint_identity, platform_identity
from lockstep.harness.replay.record import RNG_GREEDY
from lockstep.harness.replay.run import Setup, checkpoint_folder
from lockstep.harness.target import RNG_COINS, RNG_MODELS
from lockstep.harness.targets import NotApplicable, UnknownTarget, UpstreamChanged, get


def load(name: str):
    """The target `name`, or a TraceError saying why it cannot run here."""

    try:
        return get(name)
    except UnknownTarget as e:
        raise TraceError(str(e)) from None
    except (NotApplicable, UpstreamChanged, ImportError) as e:
        raise TraceError(f"target {name!r} cannot run here: {_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - the target's own factory crashed
        raise TraceError(f"target {name!r} cannot load: its factory crashed: {_line(located(e))}") from None


def _line(e) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def rng_of(target, request: Request) -> str:
    if request.params.is_greedy:
        return RNG_GREEDY
    model = target.rng
    if model is None:
        raise TraceError(f"target {target.name!r} declares no RNG model for its seeded sampling (Target.rng); "
                         f"only greedy requests can be recorded from it")
    if model not in RNG_MODELS:
        raise TraceError(f"target {target.name!r} declares RNG model {model!r}; known: {', '.join(RNG_MODELS)}")
    if model == RNG_COINS:
        if target.name != "lockstep":
            raise TraceError(f"target {target.name!r} declares {RNG_COINS}, Lockstep's own coin contract; another "
                             f"engine's trace names its own model ('stateless' or 'stateful')")
        return RNG_COINS
    return f"target:{target.name} " + ("stateless (seed, position)" if model == "stateless" else
                                       "stateful (generator)")


def generation(target, requests: list[Request], setup: Setup):
    """(call(checkpoint_dir, [Request]) -> [Result], the operation's name), or a TraceError
    naming what the target lacks for these requests here."""

    sampled = any(not r.params.is_greedy for r in requests)
    chunked = setup.prefill_chunk is not None
    why = f"target {target.name!r} cannot record these requests here"
    if "generate" in target.ops:
        needs = ("prefill_chunk",) if chunked else ()
        try:
            gen = target.op("generate", setup.device, needs)
        except NotApplicable as e:
            raise TraceError(f"{why}: {_line(e)}") from None
        if "batch" in target.ops["generate"].features:
            return (lambda ckpt, reqs: list(gen(ckpt, reqs, max_batch=setup.max_batch, **_chunk(setup)))), "generate"
        return (lambda ckpt, reqs: [o for r in reqs for o in gen(ckpt, [r], max_batch=1, **_chunk(setup))]), \
            "generate"
    if "greedy_generate" in target.ops and not sampled and not chunked:
        try:
            greedy = target.op("greedy_generate", setup.device)
        except NotApplicable as e:
            raise TraceError(f"{why}: {_line(e)}") from None
        return (lambda ckpt, reqs: [Result(*greedy(ckpt, r.prompt, r.params.max_new_tokens, r.params.stop_token_ids))
                                    for r in reqs]), "greedy_generate"
    if "greedy_generate" in target.ops:
        what = "seeded sampling" if sampled else "chunked prefill (--prefill-chunk)"
        raise TraceError(f"{why}: it has only greedy_generate (greedy, unchunked), not {what}: "
                         f"{target.missing.get('generate', 'no generate operation')}")
    reason = target.missing.get("generate") or target.missing.get("greedy_generate") or "no generate operation"
    raise TraceError(f"{why}: it has no generation operation (generate or greedy_generate): {reason}")


def _chunk(setup: Setup) -> dict:
    return {"prefill_chunk": setup.prefill_chunk} if setup.prefill_chunk is not None else {}


def record_target(name: str, setup: Setup, requests: list[Request]) -> Trace:
    target = load(name)
    for i, r in enumerate(requests):
        if r.seed is None and not r.params.is_greedy:
            raise TraceError(f"request {i}: sampled without a seed; a recording must be reproducible "
                             f"(give it a seed, or make it greedy)")
    call, op = generation(target, requests, setup)
    rngs = [rng_of(target, r) for r in requests]
    folder = checkpoint_folder(setup)
    try:
        outputs = call(folder, list(requests))
    except Exception as e:  # noqa: BLE001 - the target's code crashed: one located line
        raise TraceError(f"target {target.label}: {op} crashed: {_line(located(e))}") from None
    outputs = _checked(target, outputs, requests, _vocab(folder))
    m = {"format": FORMAT, "version": TRACE_VERSION, "source": f"target:{target.name}",
         "engine": {"name": target.name, "version": target.version, "description": target.description,
                    "operation": op, "rng": target.rng},
         "target": {"name": target.name, "version": target.version, "operation": op, "rng": target.rng,
                    "device": setup.device, "max_batch": setup.max_batch, "prefill_chunk": setup.prefill_chunk},
         "settings": {**setup.settings(), "mode": "generate"},
         "platform": platform_identity(setup.dtype, setup.backend, setup.device),
         "checkpoint": {"ref": setup.checkpoint, **checkpoint_identity(folder)},
         "draft": None, "speculative": None, "requests": len(requests)}
    reqs, steps = [], []
    for i, (r, (tokens, logprobs, reason), rng) in enumerate(zip(requests, outputs, rngs)):
        reqs.append({"index": i, **r.to_dict(),
                     "rng": rng, "eagle3": None, "finish_reason": reason, "tokens": len(tokens)})
        steps.append([{"request": i, "step": k, "token": t, "logprob": lp if math.isfinite(lp) else None,
                       "logprob_bits": f32_bits(lp),
                       "margin": None, "margin_bits": None, "logits_sha256": None, "experts": []}
                      for k, (t, lp) in enumerate(zip(tokens, logprobs))])
    return Trace(m, reqs, steps, [[] for _ in requests])


def _vocab(folder) -> int | None:
    try:
        return int(json.loads((folder / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None                     # checkpoint_identity names an unreadable config


def _checked(target, outputs, requests, vocab: int | None) -> list[tuple[list[int], list[float], str]]:
    """The target's outputs as (token ids, float32 logprobs, finish reason), or a TraceError
    naming the first thing that is not what the interface promises."""

    who = f"target {target.label}"
    outputs = list(outputs)
    if len(outputs) != len(requests):
        raise TraceError(f"{who} returned {len(outputs)} outputs for {len(requests)} requests")
    out = []
    for i, o in enumerate(outputs):
        try:
            tokens = [int(t) for t in o.tokens]
            lps = [float(x) for x in torch.as_tensor(o.logprobs).detach().to("cpu", torch.float32).reshape(-1)]
        except (TypeError, ValueError, AttributeError, RuntimeError) as e:
            raise TraceError(f"{who}: request {i}: its output is not token ids and logprobs ({_line(e)})") from None
        if len(tokens) != len(lps):
            raise TraceError(f"{who}: request {i}: {len(tokens)} tokens but {len(lps)} logprobs")
        if not tokens:
            raise TraceError(f"{who}: request {i}: no tokens generated")
        if vocab is not None and any(not 0 <= t < vocab for t in tokens):
            k = next(k for k, t in enumerate(tokens) if not 0 <= t < vocab)
            raise TraceError(f"{who}: request {i}, step {k}: token {tokens[k]} is outside the vocabulary [0, {vocab})")
        if len(tokens) > requests[i].params.max_new_tokens:
            raise TraceError(f"{who}: request {i}: {len(tokens)} tokens, more than max_new_tokens "
                             f"{requests[i].params.max_new_tokens}")
        bad = next((k for k, x in enumerate(lps) if math.isnan(x) or x > 0), None)
        if bad is not None:
            raise TraceError(f"{who}: request {i}, step {bad}: logprob {lps[bad]} is not a log-probability")
        reason = getattr(o, "finish_reason", None)
        if reason not in ("stop", "length"):
            raise TraceError(f"{who}: request {i}: finish reason {reason!r} (expected 'stop' or 'length')")
        out.append((tokens, lps, reason))
    return out
