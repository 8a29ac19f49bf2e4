"""The default target: Lockstep's own kernels and engine, through the target operations.

Two views of one implementation. `engine(ctx)` is what plain `lockstep check` (and `regen`, and
the pytest plugin) runs every spec against: the same operations under the run's settings (device,
backend, dtype policy, topologies; harness/targets/lockstep_run.py), with those only Lockstep's
engine exposes, and harness/runner.py judges it against the goldens bit for bit. `load()`
(`--target lockstep` of `report` and `record`, and tests/targets) is the same code as a peer sees
it, through the operations below only, so the target path is itself checked against Lockstep's
goldens.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from lockstep.harness.targets.base import CPU, CUDA, INTERPRETER, PROPERTIES, RNG_COINS, Op, Target
from lockstep.harness.targets.lockstep_run import PrefixSession, draft_stages, run_ops


def _hash(seed, pos, col):
    from lockstep.kernels.coins import murmur_hash32_torch
    return murmur_hash32_torch(seed, pos, col)


def _verify_coins(seeds, seq_lens, n):
    from lockstep.kernels.coins import verify_coins
    return verify_coins(seeds, seq_lens, n)


def _gumbel(seed, pos, col):
    from lockstep.kernels.coins import gumbel_noise
    return gumbel_noise(seed, pos, col)


def _eagle3_layers(draft_config, convention, num_layers, fc_in, hidden, name, direct_ids=False):
    from lockstep.engine.boundaries import LayerIdError, aux_layer_ids_from_draft_config, resolve_boundaries

    if fc_in % hidden:
        raise LayerIdError(f"{name}: the draft's fc input width {fc_in} is not a multiple of the target hidden "
                           f"size {hidden}")
    ids = aux_layer_ids_from_draft_config(draft_config)
    return resolve_boundaries(ids, convention, num_layers, fc_in // hidden, name)


@functools.lru_cache(maxsize=4)
def _model(path):
    from lockstep.engine.model import GptOssModel
    return GptOssModel.from_checkpoint(path)


def _capture(checkpoint, prompt, boundaries):
    model = _model(str(checkpoint))
    T = len(prompt)
    out = model.forward(torch.tensor(prompt), torch.arange(T), torch.zeros(T, dtype=torch.int64),
                        model.new_cache(1, T), capture=boundaries)
    return out.captured.cpu()


def _greedy_generate(checkpoint, prompt, max_new_tokens, stop_ids):
    from lockstep.engine.generate import generate
    from lockstep.engine.request import Request, SamplingParams

    params = SamplingParams(greedy=True, max_new_tokens=max_new_tokens,
                            stop_token_ids=tuple(stop_ids) if stop_ids is not None else None)
    r = generate(_model(str(checkpoint)), [Request(prompt=list(prompt), params=params)])[0]
    return r.tokens, r.logprobs, r.finish_reason


def _generate(checkpoint, requests, capture=(), prefill_chunk=None, max_batch=8):
    from lockstep.engine.generate import generate

    return generate(_model(str(checkpoint)), list(requests), capture=tuple(capture), max_batch=max_batch,
                    prefill_chunk=prefill_chunk)


@functools.lru_cache(maxsize=4)
def _draft(checkpoint, draft_dir, convention):
    from lockstep.engine.eagle3 import load_draft
    return load_draft(draft_dir, _model(checkpoint), convention=convention)


def _speculative_generate(checkpoint, draft_dir, convention, requests, speculative):
    from lockstep.engine.speculative import SpecParams, speculative_generate

    return speculative_generate(_model(str(checkpoint)), _draft(str(checkpoint), str(draft_dir), convention),
                                list(requests), SpecParams(**speculative))


def _draft_stages(checkpoint, draft_dir, convention, aux, tokens, top_k):
    """The draft's stages through Lockstep's own draft head."""
    draft = _draft(str(checkpoint), str(draft_dir), convention)
    return draft_stages(draft, aux, tokens, torch.arange(aux.shape[0]), top_k)


def _mxfp4_decode(blocks, scales, dtype):
    from lockstep.engine.mxfp4 import dequantize
    return dequantize(blocks, scales, dtype)


def _load_checkpoint(path):
    from lockstep.engine.checkpoint import load_checkpoint
    load_checkpoint(path)


def _spec(name):
    def call(*args):
        import lockstep.engine.speculative as speculative
        return getattr(speculative, name)(*args)
    return call


def _attention(q, k, v, positions, sinks, window, scale):
    from lockstep.kernels.attention import attention_triton
    kc, vc = k.transpose(0, 1)[None].contiguous(), v.transpose(0, 1)[None].contiguous()
    slots = torch.zeros(q.shape[0], dtype=torch.int64, device=q.device)
    return attention_triton(q, kc, vc, slots, positions, sinks, window, scale)


def _rmsnorm(x, w, eps):
    from lockstep.kernels.rmsnorm import rms_norm_triton
    return rms_norm_triton(x, w, eps)


def _sampling(logp, seeds, positions, col_base=None):
    from lockstep.kernels.sampling import SAMPLE_COLUMNS, gumbel_argmax_triton
    return gumbel_argmax_triton(logp, seeds, positions, SAMPLE_COLUMNS if col_base is None else col_base)


def engine(ctx) -> Target:
    """Lockstep's engine under the run context `ctx` (a harness.result.RunContext): the default
    target of `check` (see the module's docstring). `load()`'s operations, with those the run's
    device, backend and dtype policy decide (and those only Lockstep's engine exposes) from
    harness/targets/lockstep_run.py; judged against the goldens (`has_goldens`). Built afresh for
    every spec (a few dicts of closures): its operations bind the functions the modules hold now,
    so a planted fault is always what runs; the costly things (models, drafts) are cached where
    they are loaded."""
    from lockstep.engine.checkpoint import CheckpointError

    base = load()
    return dataclasses.replace(base, ops={**base.ops, **run_ops(ctx)}, refusals=(CheckpointError,),
                               has_goldens=True)


def load() -> Target:
    from lockstep.harness.version import version
    every = (CPU, INTERPRETER, CUDA)
    kernels = (INTERPRETER, CUDA)
    return Target(
        name="lockstep", version=version(),
        description="Lockstep's own kernels (Triton) and reference engine: the default target",
        conventions=("boundary", "sglang", "output-index"),
        rng=RNG_COINS,
        claims=frozenset(PROPERTIES),          # D1-D4 hold for Lockstep's engine: the goldens prove them
        ops={
            "hash": Op(_hash, every, "lockstep.kernels.coins.murmur_hash32_torch"),
            "verify_coins": Op(_verify_coins, every, "lockstep.kernels.coins.verify_coins"),
            "gumbel": Op(_gumbel, every, "lockstep.kernels.coins.gumbel_noise"),
            "eagle3_layers": Op(_eagle3_layers, every, "lockstep.engine.boundaries.resolve_boundaries"),
            "capture": Op(_capture, every, "lockstep.engine.model.GptOssModel.forward(capture=…)"),
            "greedy_generate": Op(_greedy_generate, every, "lockstep.engine.generate.generate"),
            "generate": Op(_generate, every, "lockstep.engine.generate.generate",
                           frozenset({"sampling", "batch", "capture", "prefill_chunk"})),
            "speculative_generate": Op(_speculative_generate, every, "lockstep.engine.speculative.speculative_generate",
                                       frozenset({"sampling", "batch", "greedy", "target-only", "rejection",
                                                  "tree"})),
            "prefix_cache": Op(lambda checkpoint, block: PrefixSession(_model(str(checkpoint)), block), every,
                               "lockstep.engine.prefix_cache.PrefixCache through engine.generate.generate",
                               frozenset({"sampling", "prefill_chunk"})),
            "mxfp4_decode": Op(_mxfp4_decode, every, "lockstep.engine.mxfp4.dequantize"),
            "load_checkpoint": Op(_load_checkpoint, every, "lockstep.engine.checkpoint.load_checkpoint"),
            "draft_stages": Op(_draft_stages, every, "lockstep.engine.eagle3.Eagle3Draft (one committed draft step)"),
            "verify_greedy": Op(_spec("verify_greedy"), every,
                             "lockstep.engine.speculative.verify_greedy (the round's _accept_greedy on one tree)"),
            "verify_target_only": Op(_spec("verify_target_only"), every,
                                  "lockstep.engine.speculative.verify_target_only (the round's _accept_target_only on one tree)"),
            "verify_rejection": Op(_spec("verify_rejection"), every,
                                "lockstep.engine.speculative.verify_rejection (the round's _accept_rejection on one tree)"),
            "attention": Op(_attention, kernels, "lockstep.kernels.attention (Triton)"),
            "rmsnorm": Op(_rmsnorm, kernels, "lockstep.kernels.rmsnorm (Triton)"),
            "sampling": Op(_sampling, kernels, "lockstep.kernels.sampling (Triton)", frozenset({"col_base"})),
        })
