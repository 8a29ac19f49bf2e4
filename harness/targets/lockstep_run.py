"""Lockstep's engine under one run's settings: every operation of the `lockstep` target, once.

`run_ops(ctx)` builds them for the run's context: the device, the kernel backend (torch or
triton), the dtype policy, plus the extra topologies of `--world-size`; `engine(ctx)` and `load()`
(the defaults) in harness/targets/lockstep.py wrap them. harness/target.py documents each
operation and its features, those only Lockstep's engine exposes (backend agreement, its kernel
interface, internals the kinds pin) included: a peer lacks those, and the spec is n/a there with
the reason. One model cache (harness.checkpoints.model_at) and one draft cache (`draft`).
"""

from __future__ import annotations

import functools

import torch

import lockstep.engine.mxfp4 as mx
import lockstep.engine.speculative as speculative
import lockstep.kernels.matmul as matmul
from lockstep.engine import boundaries as layer_ids
from lockstep.engine.cases import every_case
from lockstep.engine.checkpoint import load_checkpoint
from lockstep.engine.eagle3 import load_draft
from lockstep.engine.generate import generate
from lockstep.engine.model import Step
from lockstep.engine.ops import ops_for
from lockstep.engine.parallel import generate_at, plan_splits, speculative_generate_at
from lockstep.engine.prefix_cache import PrefixCache
from lockstep.engine.request import Request, SamplingParams
from lockstep.engine.rope import rope_cos_sin
from lockstep.engine.sampling import sample_rows
from lockstep.engine.speculative import SpecParams, draft_top_k, speculative_generate
from lockstep.harness.checkpoints import model_at
from lockstep.harness.replay.record import record
from lockstep.harness.replay.run import Setup
from lockstep.harness.result import RunContext
from lockstep.harness.target import CPU, CUDA, INTERPRETER, Op
from lockstep.kernels import portable, primitives
from lockstep.kernels.coins import gumbel_from_hash, murmur_hash32_torch, murmur_hash32_triton, verify_coins

EVERY = (CPU, INTERPRETER, CUDA)
MURMUR = {"torch": murmur_hash32_torch, "triton": murmur_hash32_triton}   # the hashes that must agree


class BackendDisagreement(AssertionError):
    pass


def agree(by_backend: dict[str, torch.Tensor]) -> torch.Tensor:
    """The first backend's output, once every other backend gave the same bits (else BackendDisagreement)."""
    (ref_name, ref), *others = by_backend.items()
    for name, t in others:
        if t.dtype != ref.dtype or t.shape != ref.shape or not t.view(torch.uint8).equal(ref.view(torch.uint8)):
            bad = (t != ref).nonzero()[:5].tolist() if t.shape == ref.shape else "shape"
            raise BackendDisagreement(f"backends {ref_name!r} and {name!r} disagree, first at {bad}")
    return ref


# --------------------------------------------------------------------------- coins (feature "backends")
def _coin_ops(device: torch.device) -> dict[str, Op]:
    """hash / verify_coins / gumbel on the run's device, each computed by every backend named
    (default: torch) and refused unless they agree bitwise; outputs on the CPU."""
    def keys(*ts):
        return [t.to(device) for t in ts]

    def hash_(seed, pos, col, backends=("torch",)):
        s, p, c = keys(seed, pos, col)
        return agree({b: MURMUR[b](s, p, c) for b in backends})

    def coins(seeds, seq_lens, n, backends=("torch",)):
        s, p = keys(seeds, seq_lens)
        per_backend = {b: verify_coins(s, p, n, MURMUR[b]) for b in backends}
        agree({b: torch.cat([c, f[:, None]], 1) for b, (c, f) in per_backend.items()})
        c, f = per_backend[backends[0]]
        return c.cpu(), f.cpu()

    def gumbel(seed, pos, col, backends=("torch",)):
        return gumbel_from_hash(hash_(seed, pos, col, backends)).cpu()

    feature = frozenset({"backends"})
    return {"hash": Op(lambda *a, **k: hash_(*a, **k).cpu(), EVERY, "lockstep.kernels.coins.murmur_hash32_{torch,triton}",
                       feature),
            "verify_coins": Op(coins, EVERY, "lockstep.kernels.coins.verify_coins on each backend's hash", feature),
            "gumbel": Op(gumbel, EVERY, "lockstep.kernels.coins.gumbel_from_hash of the agreed hash", feature)}


# --------------------------------------------------------------------------- MXFP4
def _mxfp4_ops(ctx: RunContext) -> dict[str, Op]:
    """The run's backend's decode: Triton's is the decode the matmul and grouped-expert kernels do
    in their tile loads, torch's is engine.mxfp4.dequantize."""

    decode, note = (matmul.mxfp4_decode_triton, "lockstep.kernels.matmul.mxfp4_decode_triton (the kernels' tile decode)") \
        if ctx.backend == "triton" else (mx.dequantize, "lockstep.engine.mxfp4.dequantize")

    def mxfp4_decode(blocks, scales, dtype):
        return decode(blocks.to(ctx.device), scales.to(ctx.device), dtype).cpu()
    return {"mxfp4_decode": Op(mxfp4_decode, EVERY, note)}


# --------------------------------------------------------------------------- whole-model forward
def model(ctx: RunContext, checkpoint):
    """The checkpoint's model under the run's backend, device and dtype policy (cached)."""
    return model_at(checkpoint, ctx.backend, ctx.device, ctx.platform.dtype)


def prompt_states(m, prompt, boundaries) -> torch.Tensor:
    """[T, count * H]: the boundary states one forward of `prompt` captures on model `m` (a fresh cache)."""
    T = len(prompt)
    out = m.forward(torch.tensor(prompt), torch.arange(T), torch.zeros(T, dtype=torch.int64), m.new_cache(1, T),
                    capture=boundaries)
    return out.captured.cpu()


def _forward_ops(ctx: RunContext) -> dict[str, Op]:
    """capture under the run's settings (raising engine.boundaries.CaptureError where the engine
    sees its capture contract broken), and walk_boundaries: every boundary state by calling the
    blocks one at a time, with no capture code (each block owns its norms and residual adds)."""

    def capture(checkpoint, prompt, boundaries):
        return prompt_states(model(ctx, checkpoint), prompt, boundaries)

    @torch.inference_mode()
    def walk_boundaries(checkpoint, prompt):
        m, T = model(ctx, checkpoint), len(prompt)
        positions = torch.arange(T, device=m.device)
        slots = torch.zeros(T, dtype=torch.int64, device=m.device)
        step = Step(positions, slots, m.new_cache(1, T), *rope_cos_sin(positions, m.inv_freq, m.mscale))
        x = m.embed_tokens(torch.tensor(prompt).to(m.device))
        states = [x]                                                       # boundary 0
        for block in m.blocks:
            x = block(x, step)
            states.append(x)                                               # boundary i + 1
        return [s.cpu() for s in states]

    return {"capture": Op(capture, EVERY, "lockstep.engine.model.GptOssModel.forward(capture=…) under the run's settings"),
            "walk_boundaries": Op(walk_boundaries, EVERY, "lockstep.engine.model: the blocks called one at a time")}


# --------------------------------------------------------------------------- generation
class PrefixSession:
    """One engine.prefix_cache.PrefixCache on a model (the prefix_cache capability)."""

    def __init__(self, model, block):
        self.model, self.cache = model, PrefixCache(block)

    def generate(self, requests, prefill_chunk=None):
        return generate(self.model, list(requests), prefix_cache=self.cache, prefill_chunk=prefill_chunk)

    @property
    def hits(self):
        return self.cache.hits

    @property
    def hit_tokens(self):
        return self.cache.hit_tokens


def draft_stages(draft, aux, tokens, positions, k: int) -> dict[str, torch.Tensor]:
    """The draft head's internals (DESIGN §4) for R rows as one committed draft step, and its top-k."""

    if k > draft.config.draft_vocab_size:
        raise ValueError(f"top_k {k} exceeds the draft vocabulary ({draft.config.draft_vocab_size})")
    R = aux.shape[0]
    fc_in = draft.fc_input(aux)
    h = draft.combine_aux(aux)
    kv = draft.new_kv(1, max(R, 1))
    step = draft.forward(tokens, positions, h, kv, torch.zeros(R, dtype=torch.int64, device=draft.device), commit=True)
    tops = [draft_top_k(step.logits[r], k) for r in range(R)]
    top_lp = torch.stack([lp for lp, _ in tops])
    top_ids = torch.stack([ids for _, ids in tops])
    return {"fc_input": fc_in, "fc_output": h, "hidden": step.hidden, "logits": step.logits,
            "top_logprobs": top_lp, "top_draft_ids": top_ids, "top_target_ids": draft.to_target_ids(top_ids)}


@functools.lru_cache(maxsize=8)
def draft(ctx: RunContext, checkpoint: str, draft_dir: str, convention: str):
    """The draft of `draft_dir` on the checkpoint's model under the run's settings (cached)."""
    return load_draft(draft_dir, model(ctx, checkpoint), convention=convention, backend=ctx.backend)


def _generation_ops(ctx: RunContext) -> dict[str, Op]:
    """The generation operations on the run's model and draft: generate (and greedy_generate) and
    speculative_generate (with the features "observer" and "topology"), the prefix cache, the
    draft's stages, `plan_topologies` (which splits run here), and `model` itself (the reference
    forward of the draft and distribution kinds)."""

    def generate_(checkpoint, requests, capture=(), prefill_chunk=None, max_batch=8, observer=None, tp=1, ep=1):
        kw = {"capture": tuple(capture), "max_batch": max_batch, "prefill_chunk": prefill_chunk}
        if tp * ep > 1:
            return generate_at(checkpoint, tp, ep, list(requests), backend=ctx.backend, device=ctx.device,
                               dtype=ctx.platform.dtype, trace=observer, **kw)
        return generate(model(ctx, checkpoint), list(requests), observer=observer, **kw)

    def greedy(checkpoint, prompt, max_new_tokens, stop_ids):
        params = SamplingParams(greedy=True, max_new_tokens=max_new_tokens,
                                stop_token_ids=tuple(stop_ids) if stop_ids is not None else None)
        r = generate(model(ctx, checkpoint), [Request(prompt=list(prompt), params=params)])[0]
        return r.tokens, r.logprobs, r.finish_reason

    def drafted(checkpoint, draft_dir, convention):
        return draft(ctx, str(checkpoint), str(draft_dir), convention)

    def speculative(checkpoint, draft_dir, convention, requests, speculative: dict, observer=None, tp=1, ep=1):
        if tp * ep > 1:
            return speculative_generate_at(checkpoint, tp, ep, list(requests), spec=SpecParams(**speculative),
                                           draft=draft_dir, convention=convention, backend=ctx.backend,
                                           device=ctx.device, trace=observer, dtype=ctx.platform.dtype)
        return speculative_generate(model(ctx, checkpoint), drafted(checkpoint, draft_dir, convention),
                                    list(requests), SpecParams(**speculative), observer=observer)

    def stages(checkpoint, draft_dir, convention, aux, tokens, top_k):
        draft = drafted(checkpoint, draft_dir, convention)
        dev = draft.device
        return draft_stages(draft, aux.to(dev), tokens.to(dev), torch.arange(aux.shape[0], device=dev), top_k)

    run = frozenset({"sampling", "batch", "observer", "topology"})
    return {"generate": Op(generate_, EVERY, "lockstep.engine.generate.generate under the run's settings",
                           run | {"capture", "prefill_chunk"}),
            "greedy_generate": Op(greedy, EVERY, "lockstep.engine.generate.generate (greedy, one request)"),
            "prefix_cache": Op(lambda checkpoint, block: PrefixSession(model(ctx, checkpoint), block), EVERY,
                               "lockstep.engine.prefix_cache.PrefixCache through engine.generate.generate",
                               frozenset({"sampling", "prefill_chunk"})),
            "speculative_generate": Op(speculative, EVERY, "lockstep.engine.speculative.speculative_generate under the run's "
                                       "settings", run | {"greedy", "target-only", "rejection", "tree"}),
            "draft_stages": Op(stages, EVERY, "lockstep.engine.eagle3.Eagle3Draft under the run's settings"),
            "plan_topologies": Op(lambda config, wanted, world_sizes: plan_splits(config, wanted, world_sizes, ctx.device),
                                  EVERY, "lockstep.engine.parallel.plan_splits: the splits that run here"),
            "model": Op(lambda checkpoint: model(ctx, checkpoint), EVERY,
                        "lockstep.engine.model.GptOssModel under the run's settings (its internals, for reference forwards)")}


# --------------------------------------------------------------------------- kernels
def _kernel_ops() -> dict[str, Op]:
    """Each declared kernel case's operation (engine/cases.py): attention, rmsnorm and sampling of
    the documented interface, and Lockstep's own kernel interface (the kernel kind holds the
    torch references)."""

    ops = {c.name: Op(c.op, (INTERPRETER, CUDA), c.note, frozenset(c.features)) for c in every_case().values()}
    gumbel_max = ops["sampling"]
    ops["sampling"] = Op(_sampling(gumbel_max.fn), gumbel_max.where, f"{gumbel_max.note}; with params=: "
                         f"lockstep.engine.sampling.sample_rows by the triton ops' sampler", gumbel_max.features | {"params"})
    return ops


def _sampling(gumbel_max):
    """The `sampling` operation: the Gumbel-max kernel on log-probabilities, or with params= the
    engine's own sampler on raw logits (engine.sampling.sample_rows: temperature, the filters, the
    coin draw) by the triton ops table's sampler of the logits' device (on a GPU the fused kernel)."""
    def sampling(logp, seeds, positions, col_base=None, params=None):
        if params is None:
            return gumbel_max(logp, seeds, positions, col_base=col_base)
        if col_base is not None:
            raise ValueError("sampling: col_base belongs to the Gumbel-max form; with params the columns are "
                             "vocab ids (DESIGN §5)")
        return sample_rows(logp, list(params), [int(s) for s in seeds.tolist()], [int(p) for p in positions.tolist()],
                           sampler=ops_for("triton", logp.device).sampler)
    return sampling


# --------------------------------------------------------------------------- checkpoints, layer ids, verify
def _eagle3_layers(draft_config, convention, num_layers, fc_in, hidden, name, direct_ids=False):
    if fc_in % hidden:
        raise layer_ids.LayerIdError(f"{name}: the draft's fc input width {fc_in} is not a multiple of the target hidden "
                           f"size {hidden}")
    ids = layer_ids.aux_layer_ids_from_draft_config(draft_config)     # through the module: tests plant rules there
    return layer_ids.resolve_boundaries(ids, convention, num_layers, fc_in // hidden, name)


def _load_checkpoint(path):
    load_checkpoint(path)


def _verify(name):
    def call(*args):
        return getattr(speculative, name)(*args)
    return call


def _engine_ops() -> dict[str, Op]:
    """The operations no run setting changes: layer ids, checkpoint refusals, verify decisions."""
    ops = {"eagle3_layers": Op(_eagle3_layers, EVERY, "lockstep.engine.boundaries.resolve_boundaries"),
           "load_checkpoint": Op(_load_checkpoint, EVERY, "lockstep.engine.checkpoint.load_checkpoint")}
    for rule in ("greedy", "target_only", "rejection"):
        ops[f"verify_{rule}"] = Op(_verify(f"verify_{rule}"), EVERY, f"lockstep.engine.speculative.verify_{rule} (the "
                                   f"round's _accept_{rule} on one tree)")
    return ops


# --------------------------------------------------------------------------- internals the kinds pin
def torch_impl(fn: str, x: torch.Tensor):
    """A primitive's torch implementation (kernels.portable: the ops the torch paths build on)."""

    simple = {"exp": portable.exp, "log": portable.log, "sigmoid": portable.sigmoid, "exp64": portable.exp64,
              "log64": portable.log64, "sincos64": portable.sincos64, "tree_sum": portable.tree_sum,
              "prefix_sum": portable.prefix_sum, "sqrt": portable.sqrt, "sqrt64": portable.sqrt64,
              "to_bf16": lambda t: t.to(torch.bfloat16), "to_fp32": lambda t: t.to(torch.float32),
              "f64_to_f32": lambda t: t.to(torch.float32)}
    if fn == "running_sum":
        return torch.stack([portable.running_sum(row) for row in x])
    return simple[fn](x)


def triton_impl(fn: str, x: torch.Tensor, device) -> torch.Tensor:
    """A primitive's Triton implementation (kernels.primitives: what the kernels build on)."""

    return primitives.apply(fn, x.to(device)).cpu()


def _internal_ops(ctx: RunContext) -> dict[str, Op]:
    """primitive: Lockstep's own primitives (torch on the CPU, Triton on the run's device);
    record_trace: a trace the engine records (fp32, torch ops, the run's device) for replay's
    verdict logic to judge."""
    def primitive(fn, implementation, x):
        return torch_impl(fn, x) if implementation == "torch" else triton_impl(fn, x, ctx.device)

    def record_trace(checkpoint, requests, draft=None, speculative=None):
        setup = Setup(checkpoint, dtype="fp32", backend="torch", device=str(ctx.device), draft=draft,
                      speculative=speculative)
        return record(setup, requests)

    return {"primitive": Op(primitive, EVERY, "lockstep.kernels.portable (torch) and kernels.primitives (Triton)"),
            "record_trace": Op(record_trace, EVERY, "lockstep.harness.replay.record at fp32 with torch ops")}


def run_ops(ctx: RunContext) -> dict[str, Op]:
    """Every operation Lockstep's engine takes from the run's settings (see the module docstring)."""
    return {**_coin_ops(ctx.device), **_mxfp4_ops(ctx), **_forward_ops(ctx), **_generation_ops(ctx),
            **_engine_ops(), **_kernel_ops(), **_internal_ops(ctx)}
