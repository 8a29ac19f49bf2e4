"""A stand-in for an engine team's inference engine.

A real engine has its own model, sampler and speculative decoder; this one delegates to
Lockstep's reference engine so that the example runs anywhere, but keeps the shape an adapter
meets in practice: its own request type, its own config error, and an EAGLE3 layer-id loader
that (like vLLM's default runner) reads only the top-level ids of a draft config.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class EngineConfigError(Exception):
    """myengine's own exception for a bad configuration (a clean refusal, not a crash)."""


@dataclass
class SamplingRequest:
    """myengine's request: a prompt, a seed, and its sampling settings by name (temperature, top_k,
    top_p, min_p, max_new_tokens, greedy, stop_token_ids; one left out takes its default)."""
    prompt: list[int]
    seed: int | None
    sampling: dict = field(default_factory=dict)


def _engine_request(r: SamplingRequest):
    from lockstep.engine.generate import Request
    from lockstep.engine.sampling import SamplingParams

    return Request(prompt=list(r.prompt), seed=r.seed, params=SamplingParams(**r.sampling))


def load(checkpoint: str):
    from lockstep.engine.model import GptOssModel
    return GptOssModel.from_checkpoint(checkpoint)


def generate(model, requests: list[SamplingRequest]):
    """Batched decoding with seeded sampling (the request's seed, Lockstep's coin contract)."""
    from lockstep.engine.generate import generate as run
    return run(model, [_engine_request(r) for r in requests])


def speculative(model, draft_dir: str, convention: str, requests: list[SamplingRequest], num_steps: int, topk: int,
                draft_token_num: int, verify: str, threshold_single: float = 1.0, threshold_acc: float = 1.0):
    """EAGLE3 speculative decoding: tokens, logprobs and the accept length of every verify round."""
    from lockstep.engine.eagle3 import load_draft
    from lockstep.engine.speculative import SpecParams, speculative_generate

    draft = load_draft(draft_dir, model, convention=convention)
    params = SpecParams(num_steps=num_steps, topk=topk, draft_token_num=draft_token_num, verify=verify,
                        threshold_single=threshold_single, threshold_acc=threshold_acc)
    return speculative_generate(model, draft, [_engine_request(r) for r in requests], params)


def aux_layers(draft_config: dict, num_layers: int, expected_count: int) -> list[int]:
    """Boundaries captured for the draft under the boundary convention (ids used as-is). Reads the
    ids at the top level of the draft config only: ids nested in `eagle_config` are not seen (a
    known bug, recorded in its Lockstep expectations)."""
    ids = draft_config.get("eagle_aux_hidden_state_layer_ids")
    ids = list(ids) if ids else [2, num_layers // 2, num_layers - 3]
    for i in ids:
        if not 0 <= i <= num_layers:
            raise EngineConfigError(f"aux layer {i} is not a boundary of a {num_layers}-layer model (0 to {num_layers})")
    if len(set(ids)) != len(ids):
        raise EngineConfigError(f"aux layers {ids} repeat a boundary")
    if len(ids) != expected_count:
        raise EngineConfigError(f"the draft expects {expected_count} aux states, its config gives {len(ids)}: {ids}")
    return ids
