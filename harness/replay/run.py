"""Running requests the way a trace says (or a replay overrides): one device or a tp × ep topology
over torch.distributed, plain or speculative, free-running or teacher-forced.

Everything goes through the engine's public entry points: harness.checkpoints for the models,
engine.generate.generate / engine.speculative.speculative_generate on one device, and
engine.parallel.generate_at / speculative_generate_at on a topology (gloo on the CPU).
Teacher forcing is plain generation with `forced=` tokens (engine.generate), at any topology, or
prefill-shaped on one device (engine.teacher_forcing): D3 makes the logits of position t the same
whether t was decoded, verified or prefilled.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from lockstep.engine.generate import generate
from lockstep.engine.model import GptOssModel
from lockstep.engine.parallel import generate_at, speculative_generate_at
from lockstep.engine.request import Request, SamplingParams
from lockstep.engine.speculative import SpecParams, speculative_generate
from lockstep.engine.teacher_forcing import teacher_force
from lockstep.harness.checkpoints import draft_dir, draft_for, model_for, target_dir
from lockstep.harness.heartbeat import Heartbeat
from lockstep.harness.replay.observe import StepLog
from lockstep.harness.replay.spread import spread

ROOT = Path(__file__).resolve().parent.parent.parent        # the project root (holds specs/, models/)


@dataclass
class Setup:
    """How a run is run: everything a replay may change except the checkpoint and the platform."""
    checkpoint: dict                                   # a spec's checkpoint form: {path: ...} or {preset, seed, format}
    dtype: str = "fp32"
    backend: str = "torch"
    tp: int = 1
    ep: int = 1
    max_batch: int = 8
    prefill_chunk: int | None = None
    draft: dict | None = None                          # a spec's draft form ({path, convention} or synthetic)
    speculative: dict | None = None                    # SpecParams fields
    order: list[int] | None = None                     # the batch composition: request indices, in run order
    device: str = "cpu"
    forced_shape: str = "decode"                       # teacher forcing: "decode" (generate, one token a step)
                                                       # or "prefill" (every recorded token in chunked forwards)

    def settings(self) -> dict:
        d = asdict(self)
        d.pop("checkpoint"), d.pop("draft"), d.pop("speculative"), d.pop("order"), d.pop("forced_shape")
        return {**d, "topology": [self.tp, self.ep], "graphs": False}


def checkpoint_folder(setup: Setup) -> Path:
    """The target's folder: a spec form, or an absolute path given on the command line."""
    if "path" in setup.checkpoint and Path(setup.checkpoint["path"]).is_absolute():
        return Path(setup.checkpoint["path"])
    return target_dir(setup.checkpoint, ROOT)


def target_model(setup: Setup):
    if "path" in setup.checkpoint and Path(setup.checkpoint["path"]).is_absolute():
        return GptOssModel.from_checkpoint(setup.checkpoint["path"], backend=setup.backend, device=setup.device,
                                           dtype=setup.dtype)
    return model_for(setup.checkpoint, setup.backend, ROOT, device=setup.device, dtype=setup.dtype)


def draft_folder(setup: Setup) -> Path:
    return draft_dir(setup.draft, setup.checkpoint, ROOT)


def run(setup: Setup, requests: list[Request], log: StepLog | None = None, forced: list[list[int]] | None = None,
        engine_trace=None, dp: int = 1):
    """-> results in request order (engine.request.Result). `forced`: teacher-force plain
    generation with these tokens (the speculative settings are then ignored). `setup.order`
    runs the batch in another composition; results and the log come back in request order.
    `engine_trace`: an engine.trace.OpTrace to attach as it is (its request index is the one in
    run order), for harness.locate's re-runs. `dp` > 1: the requests spread over that many
    data-parallel ranks, each a whole model (harness.replay.spread; the same results, D2)."""
    order = setup.order or list(range(len(requests)))
    reqs = [requests[i] for i in order]
    forced_o = [forced[i] for i in order] if forced is not None else None
    speculative = setup.speculative is not None and forced is None
    total = sum(map(len, forced_o)) if forced_o is not None else sum(r.params.max_new_tokens for r in reqs)
    label = f"{'teacher-forced run' if forced is not None else 'run'} of {len(reqs)} request(s) on {setup.device}"
    if dp > 1 and engine_trace is None:
        with Heartbeat(f"{label}, {dp} data-parallel ranks"):
            return spread(_dispatch, setup, requests, order, log, forced, speculative, dp)
    sub = log.fresh([len(r.prompt) for r in reqs], order) if log is not None else engine_trace
    with Heartbeat(label, None if speculative else total,
                   (lambda: len(sub.events)) if isinstance(sub, StepLog) else None):
        results = _dispatch(setup, reqs, sub, forced_o, forced, speculative)
    back = {j: i for j, i in enumerate(order)}
    if log is not None:
        log.take(sub, back)
    out = [None] * len(requests)
    for j, i in enumerate(order):
        out[i] = results[j]
    return out


def _dispatch(setup: Setup, reqs, sub, forced_o, forced, speculative: bool):
    """The run on one device, a topology, or prefill-shaped teacher forcing."""
    if forced is not None and setup.forced_shape == "prefill":
        if setup.tp * setup.ep != 1:
            raise ValueError("prefill-shaped teacher forcing runs on one device (tp = ep = 1)")
        return teacher_force(target_model(setup), reqs, forced_o, setup.prefill_chunk or 256, setup.max_batch, sub)
    if setup.tp * setup.ep == 1:
        return _one_device(setup, reqs, sub, forced_o, speculative)
    return _topology(setup, reqs, sub, forced_o, speculative)


def _generate_kwargs(setup: Setup, forced) -> dict:
    kw = {"max_batch": setup.max_batch, "prefill_chunk": setup.prefill_chunk}
    if forced is not None:
        kw["forced"] = forced
    return kw


def _one_device(setup: Setup, reqs, log, forced, speculative: bool):
    model = target_model(setup)
    if speculative:
        draft = draft_for(setup.draft, setup.checkpoint, model, ROOT)
        return speculative_generate(model, draft, reqs, SpecParams(**setup.speculative), observer=log)
    return generate(model, reqs, observer=log, **_generate_kwargs(setup, forced))


def _topology(setup: Setup, reqs, log, forced, speculative: bool):
    ckpt = checkpoint_folder(setup)
    if speculative:
        return speculative_generate_at(ckpt, setup.tp, setup.ep, reqs, draft=draft_folder(setup),
                                       convention=setup.draft["convention"], spec=SpecParams(**setup.speculative),
                                       backend=setup.backend, device=setup.device, dtype=setup.dtype, trace=log)
    return generate_at(ckpt, setup.tp, setup.ep, reqs, backend=setup.backend, device=setup.device, dtype=setup.dtype,
                       trace=log, **_generate_kwargs(setup, forced))


def forced_requests(requests: list[Request], tokens: list[list[int]]) -> list[Request]:
    """The requests of a teacher-forced run: greedy (no coin is drawn), exactly len(tokens) new
    tokens, and no stop id (the recorded tokens decide where it ends)."""
    return [Request(prompt=r.prompt, params=SamplingParams(greedy=True, max_new_tokens=len(t), stop_token_ids=()),
                    seed=None) for r, t in zip(requests, tokens)]


