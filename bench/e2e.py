"""End to end: decode tok/s and prefill time of the engine against HF transformers
eager and against the HBM roofline, on random gpt-oss weights built on the device.

    python3 bench/e2e.py                                   # gpt-oss-20b shape, bf16 + MXFP4, deterministic + fast
    python3 bench/e2e.py --shape 120b --dtype mxfp4 --no-hf
    python3 bench/e2e.py --shape tiny --device cpu --no-graph --batches 1,2 --prefill 16 --repeat 1

What is measured, for each dtype policy (bf16: dense bf16 experts; mxfp4: packed experts, the
HF `_blocks` / `_scales` tensors) and each engine mode (deterministic: backend "triton", on the
CPU the portable "torch" backend, since Triton there is an interpreter; fast: backend "fast"):
  decode b=B   one token for each of B requests whose 128-token context (--context) is already
               in the cache; tok/s = B / step time. Through engine.graphs.DecodeGraph (a CUDA
               graph) unless --no-graph.
  prefill P    one request's P-token prompt (--prefill) into an empty cache, in seconds.
  generate b=B engine.generate.generate as a user calls it: B requests of --context prompt tokens,
               --new-tokens new tokens each, seeded sampling (temperature 1, no stop ids), wall
               clock of the whole call (prefill, every decode step, the host reads) after one
               warm-up call (which captures the graphs); tok/s = B * new tokens / seconds. The
               line under the table gives it against the decode-step rate at the same batch.
Against:
  HF eager     transformers' GptOssForCausalLM, eager attention, bf16 (fp32 on the CPU), on the
               SAME tensors (it is built on the meta device and given them with
               load_state_dict(assign=True): no second copy); decode through its DynamicCache.
               MXFP4 rows show the same HF figures: HF runs the dequantized experts (equal values).
  roofline     the weight bytes one decode step must read (dense attention, router, norms,
               lm_head, B embedding rows, and for every layer the experts the step's tokens
               actually route to: distinct across the batch; packed bytes for MXFP4), divided by
               the bandwidth of a large device-to-device copy measured in this run (bytes read +
               written). KV-cache reads are not counted.
Before timing, "weights mapped" checks that the engine reads every tensor as HF does: the model
cut to its first 2 blocks (one sliding, one full), in fp32, engine (each dtype policy and mode)
against HF on the same prompt, within 5e-3 relative (right: ~1e-6; a sink scaled by 0.9: ~2e-2).
The timed model itself is then compared at full depth against HF eager; that line is for
information (random weights amplify bf16 rounding over 24 layers until a tolerance would either
flag noise or miss a wrong sink) and fails only on non-finite logits. The script exits 3 if a
check fails, so a wrong tensor mapping cannot hide behind a speed number.

Weights: random, built tensor by tensor on the device with a torch.Generator seeded per tensor, never
written to disk, scaled like engine.checkpoint.synthetic_weights so activations stay O(1):
linears ~ N(0, 1/fan_in), norms ~ 1 + N(0, 0.1^2), embeddings and sinks ~ N(0, 1). Experts are
random MXFP4 codes with scales near 2^-6..2^-9 (see expert_scale); the dense bf16 experts are
their exact dequantization, so both policies hold the same values.

Memory: under each build a "memory" line gives the model's own bytes (its weights and buffers),
the peak device memory (CUDA) and the peak host RSS while it was built with only its dtype's
weights held by the bench, and the ratio (target <= 1.15x; bench/_memory.py); a second line the
same over its figures. One form of the experts is held at a time: the dense bf16 experts are made
from the packed ones, emptying them, and the packed ones are made again (the same values, from
per-tensor seeds) for the MXFP4 rows once the dense ones are gone.

Every figure is measured on its own: a failure (out of memory, an engine feature not there yet)
prints "n/a (reason)" in its cell and the rest still run. Times are CUDA events after warm-up
calls (which compile the kernels and capture the graphs); wall clock on the CPU.

The engine's model API (GptOssModel, forward, new_cache, engine.graphs.DecodeGraph, the op
trace) is used only in the `engine_*` functions below: a rename there is a one-line fix.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))        # this checkout's engine, not an installed copy

import torch  # noqa: E402

from lockstep.engine import mxfp4  # noqa: E402
from lockstep.engine.checkpoint import expected_tensors  # noqa: E402
from lockstep.engine.config import PRESETS, preset  # noqa: E402
from lockstep.engine.rope import rope_frequencies  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from _memory import Meter, model_bytes  # noqa: E402

SHAPES = {"20b": "gpt-oss-20b", "120b": "gpt-oss-120b"}    # other names: engine.config presets
DTYPES = ("bf16", "mxfp4")
SEED = 0


class NotAvailable(Exception):
    """An engine (or HF) feature this figure needs is not there (yet)."""


def local_module(name):
    """Import engine module `name` from this checkout only: an editable install of another
    checkout would otherwise supply the modules this one lacks."""
    import importlib
    try:
        module = importlib.import_module(name)
    except ImportError as e:
        raise NotAvailable(f"{name}: {e}") from None
    if not Path(module.__file__).resolve().is_relative_to(ROOT):
        raise NotAvailable(f"{name} is not in this checkout (only in {module.__file__})")
    return module


# ====================================================================== the engine's API
def engine_model(config, weights, backend, device, dtype, take=False):
    """GptOssModel(config, weights, backend, device, dtype); `weights` HF names, experts dense or
    packed. An engine without `dtype` computes in fp32 only. `take`: the model empties `weights` as
    it converts them (a caller holding no other reference never holds a weight twice)."""
    model_module = local_module("lockstep.engine.model")
    GptOssModel = model_module.GptOssModel
    backends = getattr(model_module, "BACKENDS", ("torch", "triton"))
    if backend not in backends:
        raise NotAvailable(f"backend {backend!r} is not in engine.model.BACKENDS {backends}")
    kwargs = dict(backend=backend, device=device)
    if "dtype" in inspect.signature(GptOssModel).parameters:
        kwargs["dtype"] = dtype
    elif dtype != "fp32":
        raise NotAvailable("GptOssModel has no dtype= (fp32 only; --compute fp32 times it)")
    if take and "take" in inspect.signature(GptOssModel).parameters:
        kwargs["take"] = True
    try:
        return GptOssModel(config, weights, **kwargs)
    except KeyError as e:
        if any(n.endswith("_blocks") for n in weights):
            raise NotAvailable(f"GptOssModel does not take packed MXFP4 experts (KeyError {e})") from None
        raise


def engine_forward(model, tokens, positions, slots, cache, rows=None):
    """-> logits [T, V]; only of `rows` [R] (-> [R, V]) when given and the engine can."""
    kwargs = {}
    if rows is not None and "logit_rows" in inspect.signature(model.forward).parameters:
        kwargs["logit_rows"] = rows
    return model.forward(tokens, positions, slots, cache, **kwargs).logits


def engine_decoder(model, cache, batch, use_graph):
    """-> step(tokens [B], positions [B], slots [B]) -> logits [B, V]: a DecodeGraph replay, or
    the eager forward under --no-graph."""
    if not use_graph:
        return lambda t, p, s: model.forward(t, p, s, cache).logits
    try:
        DecodeGraph = local_module("lockstep.engine.graphs").DecodeGraph
    except (NotAvailable, AttributeError) as e:
        raise NotAvailable(f"lockstep.engine.graphs.DecodeGraph ({e}); --no-graph times eager decode") from None
    return DecodeGraph(model, cache, batch)


def engine_generate(model, prompts, new_tokens):
    """-> a no-argument call of engine.generate.generate on `prompts` (lists of ids), seeded
    sampling at temperature 1, `new_tokens` each (no stop ids), all in one batch."""
    gen = local_module("lockstep.engine.generate")
    SamplingParams = local_module("lockstep.engine.sampling").SamplingParams
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, stop_token_ids=())
    requests = [gen.Request(prompt=list(p), params=params, seed=1000 + i) for i, p in enumerate(prompts)]
    return lambda: gen.generate(model, requests, max_batch=len(requests))


def engine_routed_experts(model, cache, tokens, positions, slots):
    """Distinct experts each layer's router picks for one eager decode step, read from the
    engine's op trace (engine.trace) -> [layers] ints, or None if the trace has no router ids."""
    model.trace = local_module("lockstep.engine.trace").OpTrace()
    try:
        model.forward(tokens, positions, slots, cache)
    finally:
        trace, model.trace = model.trace, None
    ids = [trace.ops.get(f"L{i}.router.top_ids") for i in range(model.config.num_hidden_layers)]
    return None if any(t is None for t in ids) else [int(t.unique().numel()) for t in ids]


# ====================================================================== HF transformers
def hf_model(config, weights, device, dtype):
    """GptOssForCausalLM (eager attention) made on the meta device from our config, holding our
    tensors (load_state_dict(assign=True): no copy where the dtype already matches). Norms stay
    fp32, as HF keeps them (_keep_in_fp32_modules)."""
    from transformers import GptOssConfig as HFConfig
    from transformers import GptOssForCausalLM
    hf_config = HFConfig.from_dict(config.to_hf_dict(), attn_implementation="eager")
    with torch.device("meta"):
        model = GptOssForCausalLM(hf_config)
    keep_fp32 = tuple(getattr(model, "_keep_in_fp32_modules", None) or ())
    state = {}
    for name in model.state_dict():
        fp32 = any(f".{m}." in f".{name}" for m in keep_fp32)
        state[name] = weights[name].to(device, torch.float32 if fp32 else dtype)
    model.load_state_dict(state, assign=True, strict=True)
    # RoPE's inv_freq is a non-persistent buffer (not in the state dict): compute it again.
    model.model.rotary_emb = type(model.model.rotary_emb)(config=hf_config).to(device)
    meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if meta:
        raise RuntimeError(f"HF model still has meta tensors: {meta[:3]}")
    inv_freq, mscale = rope_frequencies(config.head_dim, config.rope)     # HF's RoPE must be ours
    rotary = model.model.rotary_emb
    scaling = getattr(rotary, "attention_scaling", mscale)
    if not torch.allclose(rotary.inv_freq.cpu(), inv_freq, rtol=1e-5) or abs(scaling - mscale) > 1e-6:
        raise RuntimeError(f"HF's RoPE ({hf_config.rope_parameters}) is not the config's ({config.rope})")
    return model.eval()


def hf_forward(model, input_ids, cache=None, last_only=False):
    """input_ids [B, T] -> logits [B, T or 1, V]; `cache` (a DynamicCache) is extended in place.
    transformers 5.24 names the cache argument `cache`, earlier 5.x `past_key_values`."""
    params = inspect.signature(model.forward).parameters
    kwargs = {"use_cache": cache is not None}
    if cache is not None:
        kwargs["cache" if "cache" in params else "past_key_values"] = cache
    if last_only:
        kwargs["logits_to_keep"] = 1
    return model(input_ids=input_ids, **kwargs).logits


def hf_cache(model):
    from transformers import DynamicCache
    return DynamicCache(config=model.config)


# ====================================================================== random weights on the device
E2M1_RMS = math.sqrt(sum(v * v for v in mxfp4.E2M1_MAGNITUDES) / 8)   # of a uniformly random code


def expert_scale(fan_in: int, gain: float) -> int:
    """E8M0 scale centre that gives random codes (with scales centre-1..centre+1) a standard
    deviation near gain / sqrt(fan_in), as synthetic_weights' experts (gate_up gain 3, down 0.5)."""
    jitter_rms = math.sqrt((0.25 + 1 + 4) / 3)                         # 2^{-1, 0, 1}
    return 127 + round(math.log2(gain / math.sqrt(fan_in) / (E2M1_RMS * jitter_rms)))


# fp32 elements random_weights draws at once: a larger tensor (the 20b shape's embedding and
# lm_head, 2.3 GB each in fp32) is drawn in blocks of rows, so its fp32 form never exists whole
# (it raised an MXFP4 model's build peak to 1.17x its bytes). Smaller tensors: one draw, as before.
FLOAT_DRAW = 1 << 24


def random_weights(config, device, seed=SEED, only_packed=False):
    """-> (floats, packed): every float tensor (bf16) and the experts' MXFP4 blocks and scales
    (uint8), under their HF names, made one by one on `device`, each from a generator seeded by
    (seed, its index): `only_packed` makes the same packed experts again without the floats."""
    g = torch.Generator(device=device)
    floats, packed = {}, {}

    def normal(shape, std, mean=0.0):
        out = torch.empty(shape, dtype=torch.bfloat16, device=device)
        rows = out.view(1, -1) if out.dim() < 2 else out             # drawn in blocks of these
        step = max(1, FLOAT_DRAW // max(1, rows[0].numel()))
        for r in range(0, rows.shape[0], step):
            block = rows[r:r + step]
            t = torch.randn(block.shape, generator=g, device=device, dtype=torch.float32)
            block.copy_(t.mul_(std).add_(mean))
        return out

    for index, (name, (shape, kind)) in enumerate(expected_tensors(config, mxfp4_experts=True).items()):
        expert = name.endswith(("_blocks", "_scales"))
        if only_packed and not expert:
            continue
        g.manual_seed(seed * 1_000_003 + index)
        if name.endswith("_blocks"):
            packed[name] = torch.randint(0, 256, shape, generator=g, device=device, dtype=torch.uint8)
        elif name.endswith("_scales"):
            gain = 3.0 if "gate_up" in name else 0.5
            centre = expert_scale(shape[-1] * mxfp4.BLOCK, gain)
            packed[name] = torch.randint(centre - 1, centre + 2, shape, generator=g, device=device,
                                         dtype=torch.uint8)
        elif name.endswith("norm.weight"):
            floats[name] = normal(shape, 0.1, 1.0)
        elif name == "model.embed_tokens.weight" or name.endswith("sinks"):
            floats[name] = normal(shape, 1.0)
        elif name.endswith("router.bias"):
            floats[name] = normal(shape, 0.5)
        elif name.endswith("bias"):
            floats[name] = normal(shape, 0.1)
        else:
            floats[name] = normal(shape, 1.0 / math.sqrt(shape[-1]))
    return floats, packed


def dense_experts(packed, consume=False):
    """The packed experts dequantized (exactly) to bf16, one expert at a time so the fp32
    intermediates stay small, stored once in the model's layout [E, out, in] and handed over as
    HF's [E, in, out] view of it: a bf16 model's transpose back is that storage, not a copy (the
    20b shape's experts are ~38 GB: two copies would not fit an 80 GB card). `consume`: each
    weight's blocks and scales leave `packed` once dequantized, so the packed and the dense
    experts are never held whole together."""
    dense = {}
    for name in [n for n in packed if n.endswith("_blocks")]:
        base = name[: -len("_blocks")]
        blocks, scales = packed[name], packed[base + "_scales"]
        E, out_dim, groups = scales.shape
        w = torch.empty((E, out_dim, groups * mxfp4.BLOCK), dtype=torch.bfloat16, device=blocks.device)
        for e in range(E):
            w[e] = mxfp4.dequantize(blocks[e], scales[e], torch.bfloat16)       # [out, in]
        dense[base] = w.transpose(1, 2)                                          # HF's [E, in, out], a view
        if consume:
            del packed[name], packed[base + "_scales"], blocks, scales
    return dense


def dense_expert_bytes(config) -> int:
    c = config
    return c.num_hidden_layers * c.num_local_experts * 3 * c.hidden_size * c.intermediate_size * 2


# ====================================================================== the roofline
def decode_weight_bytes(config, policy, batch, routed) -> int:
    """Weight bytes one decode step of `batch` tokens reads; routed[l] = distinct experts of
    layer l. bf16 everywhere but the packed experts (MXFP4: 4 bits + one u8 scale per 32)."""
    c, bf16 = config, 2
    H, I, E = c.hidden_size, c.intermediate_size, c.num_local_experts
    attention = (2 * c.q_dim * H + 2 * c.kv_dim * H + c.q_dim + 2 * c.kv_dim + H + c.num_attention_heads) * bf16
    norms_router = (2 * H + E * H + E) * bf16
    expert_values = 3 * H * I                                     # gate_up 2I x H, down H x I
    if policy == "mxfp4":
        expert = expert_values // 2 + expert_values // mxfp4.BLOCK + (2 * I + H) * bf16
    else:
        expert = (expert_values + 2 * I + H) * bf16
    per_layer = sum(attention + norms_router + n * expert for n in routed)
    head = (c.vocab_size * H + H + min(batch, c.vocab_size) * H) * bf16   # lm_head, final norm, embed rows
    return per_layer + head


def expected_routed(config, batch) -> float:
    """Distinct experts of `batch` tokens under uniform top-k routing (when no trace is there)."""
    E, k = config.num_local_experts, config.num_experts_per_tok
    return E * (1 - (1 - k / E) ** batch)


def copy_bandwidth(device, nbytes) -> float:
    """Bytes per second of a large device-to-device copy, counting bytes read + written."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    seconds = time_per_call(lambda i: dst.copy_(src), device, repeat=10)
    del src, dst
    return 2 * nbytes / seconds


# ====================================================================== timing
def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_per_call(fn, device, repeat, warmup=2):
    """Seconds per fn(i) over calls warmup .. warmup + repeat - 1, after fn(0 .. warmup - 1)."""
    for i in range(warmup):
        fn(i)
    sync(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(warmup, warmup + repeat):
            fn(i)
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1e3 / repeat
    t0 = time.perf_counter()
    for i in range(warmup, warmup + repeat):
        fn(i)
    return (time.perf_counter() - t0) / repeat


def free_memory(device):
    if device.type == "cuda":
        gc.collect()                 # graphs and models may sit in reference cycles
        torch.cuda.empty_cache()


def fits(device, nbytes) -> str | None:
    """None if nbytes (plus 10 % and 4 GiB of headroom) fit in the device's free memory, else why not."""
    if device.type != "cuda":
        return None
    free_memory(device)
    free, _ = torch.cuda.mem_get_info(device)
    if nbytes * 1.1 + 4 * 2**30 <= free:
        return None
    return f"needs {nbytes / 1e9:.0f} GB of dense bf16 experts, {free / 1e9:.0f} GB free"


def attempt(fn):
    """fn()'s value, or "n/a (reason)" for a failure: this figure fails alone."""
    try:
        return fn()
    except NotAvailable as e:
        return f"n/a (not available: {e})"
    except torch.OutOfMemoryError:
        return "n/a (out of memory)"
    except Exception as e:                                           # noqa: BLE001
        traceback.print_exc(file=sys.stderr)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"n/a (error: {type(e).__name__}: {first[:160]})"


# ====================================================================== the figures
class Workload:
    """The same random token streams for the engine and HF (generated on the CPU)."""

    def __init__(self, config, args, device):
        g = torch.Generator().manual_seed(SEED + 1)
        V = config.vocab_size
        self.device = device
        self.context, self.prefill, self.repeat = args.context, args.prefill, args.repeat
        self.warmup = 2
        self.steps = self.warmup + self.repeat
        self.batches = args.batches
        self.generate_batches, self.new_tokens = args.generate_batches, args.new_tokens
        B = max(self.batches + self.generate_batches)
        self.context_tokens = torch.randint(0, V, (B, self.context), generator=g).to(device)
        self.decode_tokens = torch.randint(0, V, (self.steps, B), generator=g).to(device)
        self.prompt = torch.randint(0, V, (max(self.prefill, 1),), generator=g).to(device)
        n_check = min(2 * config.sliding_window + 24, 160)          # crosses the window on tiny shapes
        self.check_tokens = torch.randint(0, V, (n_check,), generator=g).to(device)

    def decode_positions(self, batch):
        """[steps, B]: step i decodes position context + i of every request."""
        steps = torch.arange(self.steps, device=self.device)[:, None] + self.context
        return steps.expand(self.steps, batch).contiguous()


def measure_engine(model, work, use_graph, routed_by_batch):
    """-> {figure: value}, each figure on its own (see attempt)."""
    dev = work.device
    out = {}
    for B in work.batches:
        def decode(B=B):
            cache = model.new_cache(B, work.context + work.steps + 1)
            slots = torch.arange(B, device=dev)
            C = work.context                                         # every request's context, one forward
            engine_forward(model, work.context_tokens[:B].reshape(-1), torch.arange(C, device=dev).repeat(B),
                           slots.repeat_interleave(C), cache, rows=slots * C + C - 1)
            tokens, positions = work.decode_tokens[:, :B], work.decode_positions(B)
            if B not in routed_by_batch:                             # an untimed step, traced
                routed_by_batch[B] = attempt(lambda: engine_routed_experts(model, cache, tokens[0],
                                                                           positions[0], slots))
            step = engine_decoder(model, cache, B, use_graph)
            seconds = time_per_call(lambda i: step(tokens[i], positions[i], slots), dev, work.repeat, work.warmup)
            del step, cache
            return B / seconds
        out[f"decode b={B}"] = attempt(decode)
        free_memory(dev)
    if work.prefill:
        def prefill():
            P = work.prefill
            cache = model.new_cache(1, P)
            positions, slots = torch.arange(P, device=dev), torch.zeros(P, dtype=torch.int64, device=dev)
            last = torch.tensor([P - 1], device=dev)
            return time_per_call(lambda i: engine_forward(model, work.prompt, positions, slots, cache, rows=last),
                                 dev, max(1, work.repeat // 5), warmup=1)
        out[f"prefill {work.prefill}"] = attempt(prefill)
        free_memory(dev)
    for B in work.generate_batches if work.new_tokens else ():
        def generate(B=B):
            call = engine_generate(model, work.context_tokens[:B].tolist(), work.new_tokens)
            call()                                                   # warm-up: compiles, captures
            times = []
            for _ in range(2):
                sync(dev)
                t0 = time.perf_counter()
                results = call()                                     # ends with its host read
                times.append(time.perf_counter() - t0)
                if sum(len(r.tokens) for r in results) != B * work.new_tokens:
                    raise RuntimeError("generate stopped early")
            return B * work.new_tokens / min(times)
        out[f"generate b={B}"] = attempt(generate)
        free_memory(dev)
    return out


@torch.inference_mode()
def measure_hf(model, work):
    dev = work.device
    out = {}
    for B in work.batches:
        def decode(B=B):
            cache = hf_cache(model)
            hf_forward(model, work.context_tokens[:B], cache, last_only=True)
            tokens = work.decode_tokens[:, :B]
            seconds = time_per_call(lambda i: hf_forward(model, tokens[i][:, None], cache), dev,
                                    work.repeat, work.warmup)
            return B / seconds
        out[f"decode b={B}"] = attempt(decode)
        free_memory(dev)
    if work.prefill:
        out[f"prefill {work.prefill}"] = attempt(lambda: time_per_call(
            lambda i: hf_forward(model, work.prompt[None], hf_cache(model), last_only=True),
            dev, max(1, work.repeat // 5), warmup=1))
        free_memory(dev)
    return out


# ====================================================================== does the engine read the weights as HF does?
MAPPING_LAYERS = 2        # layer 0 slides, layer 1 is full
MAPPING_TOL = 5e-3        # fp32 against fp32: ~1e-6 apart when right; a sink scaled by 0.9 moves ~2e-2


def first_layers(config, weights, layers=MAPPING_LAYERS):
    """The config and the weights of the model cut to its first `layers` blocks, floats in fp32."""
    cfg = config.replace(num_hidden_layers=layers, layer_types=config.layer_types[:layers])
    kept = {n: t.float() if t.is_floating_point() else t for n, t in weights.items()
            if not n.startswith("model.layers.") or int(n.split(".")[2]) < layers}
    return cfg, kept


def mapping_reference(config, floats, packed, tokens, device):
    """HF's fp32 logits for `tokens` on the first blocks of these weights (experts dequantized)."""
    cfg, w = first_layers(config, {**floats, **packed})
    dense = {n: t.float() for n, t in dense_experts(w).items()}
    hf = hf_model(cfg, {**w, **dense}, device, torch.float32)
    with torch.inference_mode():
        return hf_forward(hf, tokens[None])[0].float()


def mapping_check(config, weights, backend, tokens, device, reference):
    """The engine (this backend, fp32) on the same first blocks against HF's logits: whether
    every tensor is read with HF's meaning. At full depth and bf16 the random weights amplify
    rounding too much for a tight test (see compare_logits' use in main)."""
    cfg, w = first_layers(config, weights)
    model = engine_model(cfg, w, backend, device, "fp32")
    return compare_logits(engine_logits(model, tokens), reference, MAPPING_TOL)


def engine_logits(model, tokens):
    """A fresh one-request prefill of `tokens` -> logits [T, V]."""
    n, dev = tokens.shape[0], tokens.device
    with torch.inference_mode():
        return engine_forward(model, tokens, torch.arange(n, device=dev), torch.zeros(n, dtype=torch.int64, device=dev),
                              model.new_cache(1, n))


def compare_logits(ours, ref, tol=None):
    """-> (line, ok): how far our logits [T, V] are from HF's. ok: finite, and within `tol` (the
    median over positions of max |diff| / max |HF logit|) if one is given."""
    ours, ref = ours.float(), ref.float()
    diff = (ours - ref).abs()
    rel = statistics.median((diff.amax(-1) / ref.abs().amax(-1).clamp_min(1e-30)).tolist())
    cos = torch.nn.functional.cosine_similarity(ours, ref, dim=-1).median().item()
    agree = int((ours.argmax(-1) == ref.argmax(-1)).sum())
    ok = bool(torch.isfinite(ours).all()) and (tol is None or rel <= tol)
    verdict = ("OK" if ok else "MISMATCH") + (f" (tolerance {tol:g})" if tol is not None else "")
    line = (f"max |logit diff| {diff.max().item():.3g} (max |logit| {ref.abs().max().item():.3g}), "
            f"median relative {rel:.2g}, median cosine {cos:.4f}, greedy token agrees at "
            f"{agree}/{ref.shape[0]} positions: {verdict}")
    return line, ok


# ====================================================================== the report
class Cells:
    """Table cells; an "n/a (reason)" becomes "n/a [k]" with its reason listed once under the table."""

    def __init__(self):
        self.notes = []

    def value(self, v, unit):
        if isinstance(v, str):
            reason = v[len("n/a ("):-1] if v.startswith("n/a (") else v
            if reason not in self.notes:
                self.notes.append(reason)
            return f"n/a [{self.notes.index(reason) + 1}]"
        if unit == "tok/s":
            return f"{v:,.0f} tok/s" if v >= 100 else f"{v:.3g} tok/s"
        return f"{v:.4g} s"

    @staticmethod
    def speed_ratio(a, b, unit):
        """How many times faster a is than b (tok/s: a / b; seconds: b / a)."""
        if isinstance(a, str) or isinstance(b, str):
            return "—"
        return f"{(a / b if unit == 'tok/s' else b / a):.3g}×"


@dataclass
class Run:
    """What the steps of one bench run share: the parsed settings and the figures as they come."""
    args: argparse.Namespace
    device: torch.device
    config: object                      # the engine.config preset
    preset_name: str
    dtypes: list
    modes: dict                         # mode -> backend
    hf_dtype: torch.dtype
    bandwidth: float = 0.0              # measured copy bandwidth, bytes/s
    hf_skip: str | None = None          # why HF has no figures, or None
    hf_figures: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)          # (dtype, mode) -> {figure: value}; {"*": reason}
    routed_by_batch: dict = field(default_factory=dict)  # batch -> [distinct experts per layer]
    mapping_ok: bool = True
    meter: object = None                # bench/_memory.py's Meter: peaks against the model's bytes


def parse_args(argv) -> Run:
    """The command line -> a Run (argparse errors exit as before)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="20b", help="20b, 120b, tiny (or any engine.config preset)")
    ap.add_argument("--dtype", action="append", help="bf16, mxfp4 or all (repeatable, or comma-separated; default all)")
    ap.add_argument("--modes", default="deterministic,fast",
                    help="comma-separated: deterministic (triton; torch on the CPU), fast, or a backend name")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--context", type=int, default=128, help="tokens in each request's cache before decode")
    ap.add_argument("--prefill", type=int, default=2048, help="prompt length of the prefill figure (0: none)")
    ap.add_argument("--new-tokens", type=int, default=256, help="new tokens per request of the generate figure (0: none)")
    ap.add_argument("--generate-batches", default="1,32", help="batches of the generate figure")
    ap.add_argument("--repeat", type=int, default=20, help="timed decode steps (prefill: repeat // 5)")
    ap.add_argument("--no-hf", action="store_true", help="skip HF transformers")
    ap.add_argument("--no-graph", action="store_true", help="decode eagerly instead of through DecodeGraph")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--compute", choices=("bf16", "fp32"), help="engine dtype (default bf16 on CUDA, fp32 on the CPU)")
    ap.add_argument("--hf-dtype", choices=("bf16", "fp32"), help="HF dtype (default bf16 on CUDA, fp32 on the CPU)")
    args = ap.parse_args(argv)

    device = torch.device(args.device)
    on_cuda = device.type == "cuda"
    args.compute = args.compute or ("bf16" if on_cuda else "fp32")
    args.hf_dtype = args.hf_dtype or ("bf16" if on_cuda else "fp32")
    args.batches = [int(b) for b in args.batches.split(",") if b]
    args.generate_batches = [int(b) for b in args.generate_batches.split(",") if b]
    dtypes = [d for v in (args.dtype or ["all"]) for d in v.split(",") if d]
    dtypes = list(DTYPES) if "all" in dtypes else dtypes
    for d in dtypes:
        if d not in DTYPES:
            ap.error(f"--dtype {d!r}: choose from {DTYPES} or all")
    preset_name = SHAPES.get(args.shape, args.shape)
    if preset_name not in PRESETS:
        ap.error(f"--shape {args.shape!r}: choose 20b, 120b or one of {sorted(PRESETS)}")
    modes = {}
    for m in args.modes.split(","):
        modes[m] = {"deterministic": "triton" if on_cuda else "torch"}.get(m, m)
    hf_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.hf_dtype]
    return Run(args, device, preset(preset_name), preset_name, dtypes, modes, hf_dtype)


def print_header(run: Run, argv) -> None:
    """The device, versions, commit and command, and the measured copy bandwidth (run.bandwidth)."""
    import triton
    args, device, config = run.args, run.device, run.config
    on_cuda = device.type == "cuda"
    if on_cuda:
        props = torch.cuda.get_device_properties(device)
        name = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}"
    else:
        name = f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    try:
        import transformers
        hf_version = transformers.__version__
    except ImportError:
        hf_version = "not installed"
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"
    run.bandwidth = copy_bandwidth(device, (2 << 30) if on_cuda else (64 << 20))
    print(f"# bench/e2e.py — {run.preset_name}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
          f"{config.num_local_experts} experts top-{config.num_experts_per_tok}, vocab {config.vocab_size}")
    print(f"device: {name}; copy bandwidth {run.bandwidth / 1e9:,.0f} GB/s (read + write, measured)")
    print(f"torch {torch.__version__}, triton {triton.__version__}, transformers {hf_version}, commit {commit}")
    print(f"command: {shlex.join(['python3', *sys.argv])}" if argv is None else f"command: bench/e2e.py {shlex.join(argv)}")
    print(f"engine compute {args.compute}; modes {', '.join(f'{m} = backend {b!r}' for m, b in run.modes.items())}; "
          f"decode {'eager' if args.no_graph else 'through engine.graphs.DecodeGraph'}; context {args.context} tokens; "
          f"{args.repeat} timed decode steps after 2 warm-up steps; HF eager {args.hf_dtype}")
    print()
    sys.stdout.flush()


def measure_hf_side(run: Run, work, floats, packed):
    """HF's mapping reference (fp32 logits of the first blocks) and, where the dense experts fit,
    its timings and full-depth logits -> [reference, dense experts or None, HF logits or None, too_big]
    (a list: measure_engine_side empties it, so the dense experts can be freed there). The dense
    experts are made from `packed`, emptying it (packed_again makes them again for MXFP4 rows)."""
    device, config = run.device, run.config
    too_big = fits(device, dense_expert_bytes(config))
    run.hf_skip = "n/a (--no-hf)" if run.args.no_hf else f"n/a ({too_big})" if too_big else None
    reference = None
    if not run.args.no_hf:
        reference = attempt(lambda: mapping_reference(config, floats, packed, work.check_tokens, device))
        free_memory(device)
    wanted = too_big is None and ("bf16" in run.dtypes or run.hf_skip is None)
    dense = dense_experts(packed, consume=True) if wanted else None
    hf_logits = None
    if run.hf_skip is None:
        def run_hf():
            hf = hf_model(config, {**floats, **dense}, device, run.hf_dtype)
            with torch.inference_mode():
                logits = hf_forward(hf, work.check_tokens[None])[0].float()
            return logits, measure_hf(hf, work)

        got = attempt(run_hf)
        run.hf_skip, (hf_logits, run.hf_figures) = (got, (None, {})) if isinstance(got, str) else (None, got)
        free_memory(device)
    if "bf16" not in run.dtypes:
        dense = None
    return [reference, dense, hf_logits, too_big]


def packed_again(run: Run, packed) -> None:
    """Fill the emptied `packed` with the same MXFP4 experts again (random_weights' per-tensor seeds)."""
    if not packed:
        free_memory(run.device)
        packed.update(random_weights(run.config, run.device, only_packed=True)[1])


def measure_engine_side(run: Run, work, floats, packed, hf_side) -> None:
    """Each (dtype, mode): the weights-mapping checks against HF, then the engine's figures
    (run.results, run.routed_by_batch; run.mapping_ok false on a disagreement). One form of the
    experts is held at a time: the dense ones go before the packed ones are made again."""
    reference, dense, hf_logits, too_big = hf_side
    hf_side.clear()                     # no reference left behind: the dense experts go once bf16 is done
    for policy in run.dtypes:
        if policy == "bf16" and dense is None:
            run.results.update({(policy, mode): {"*": f"n/a ({too_big})"} for mode in run.modes})
            continue
        if policy == "mxfp4":
            packed_again(run, packed)
        weights = {**floats, **(dense if policy == "bf16" else packed)}
        for mode, backend in run.modes.items():
            measure_one_model(run, work, policy, mode, backend, weights, reference, hf_logits)
        del weights
        if policy == "bf16":
            dense = None
            free_memory(run.device)


def measure_one_model(run: Run, work, policy, mode, backend, weights, reference, hf_logits) -> None:
    """One (dtype, mode): its weights-mapping check, its build (memory against the model's bytes),
    the timed model against HF's logits, its figures (and their memory)."""
    args, config, device = run.args, run.config, run.device
    if isinstance(reference, torch.Tensor):
        got = attempt(lambda: mapping_check(config, weights, backend, work.check_tokens, device, reference))
        line, ok = (got, got.startswith("n/a (not available")) if isinstance(got, str) else got
        run.mapping_ok &= ok
        free_memory(device)
    else:
        line = reference or run.hf_skip
    print(f"weights mapped ({policy}, {mode}; first {MAPPING_LAYERS} layers, fp32 against HF fp32): {line}")
    run.meter.start()
    model = attempt(lambda: engine_model(config, dict(weights), backend, device, args.compute, take=True))
    if isinstance(model, str):
        run.results[policy, mode] = {"*": model}
        if model != line:
            print(f"  {policy} {mode}: {model}")
        return
    nbytes = model_bytes(model)
    label = f"{policy} {mode} build (the bench holding this dtype's weights only)"
    print(f"  {run.meter.line(label, nbytes)}")
    if hf_logits is not None:
        both_fp32 = args.compute == args.hf_dtype == "fp32"   # else: random weights amplify bf16
        tol = MAPPING_TOL if both_fp32 else None               # rounding with depth: finite only
        got = attempt(lambda: compare_logits(engine_logits(model, work.check_tokens), hf_logits, tol))
        line, ok = (got, False) if isinstance(got, str) else got
        run.mapping_ok &= ok
        print(f"  the timed model, all {config.num_hidden_layers} layers, {args.compute} against HF eager "
              f"{args.hf_dtype}{'' if both_fp32 else ' (for information: only non-finite logits fail)'}: {line}")
    sys.stdout.flush()
    run.meter.start()
    run.results[policy, mode] = measure_engine(model, work, not args.no_graph, run.routed_by_batch)
    label = f"{policy} {mode} figures (caches, graphs, activations on top)"
    print(f"  {run.meter.line(label, nbytes)}")
    del model
    free_memory(device)


def rooflines(run: Run) -> tuple[dict, list]:
    """(policy, batch) -> the decode roofline in tok/s, and one note per batch on how it was formed."""
    config, roofline, notes = run.config, {}, []
    for B in run.args.batches:
        routed = run.routed_by_batch.get(B)
        how = "routed in a traced engine step"
        if not isinstance(routed, list):
            routed = [expected_routed(config, B)] * config.num_hidden_layers
            how = "expected under uniform top-k routing (no engine trace)"
        gb = {}
        for policy in run.dtypes:
            nbytes = decode_weight_bytes(config, policy, B, routed)
            roofline[policy, B] = B * run.bandwidth / nbytes
            gb[policy] = f"{nbytes / 1e9:.3g} GB ({policy})"
        notes.append(f"b={B}: {sum(routed) / len(routed):.3g} experts per layer ({how}); "
                     f"weights read per step {', '.join(gb.values())}")
    return roofline, notes


def print_table(run: Run) -> None:
    """The figures table, its notes, the generate-vs-decode ratios and the roofline's basis."""
    args, results = run.args, run.results
    figures = [f"decode b={B}" for B in args.batches] + ([f"prefill {args.prefill}"] if args.prefill else [])
    figures += [f"generate b={B}" for B in args.generate_batches] if args.new_tokens else []
    roofline, roofline_notes = rooflines(run)
    cells = Cells()
    print()
    print("| figure | dtype | mode | ours | HF eager | ours vs HF | roofline | of roofline | deterministic vs fast |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for policy in run.dtypes:
        for fig in figures:
            unit = "s" if fig.startswith("prefill") else "tok/s"
            roof = roofline.get((policy, int(fig.split("=")[1]))) if fig.startswith("decode") else None
            hf = run.hf_figures.get(fig, run.hf_skip or "n/a")
            det, fast = results.get((policy, "deterministic"), {}), results.get((policy, "fast"), {})
            for mode in run.modes:
                r = results.get((policy, mode), {})
                ours = r.get(fig, r.get("*", "n/a"))
                vs_fast = (cells.speed_ratio(det.get(fig, det.get("*", "n/a")), fast.get(fig, fast.get("*", "n/a")), unit)
                           if mode == "deterministic" else "—")
                roof_cell = cells.value(roof, "tok/s") if roof else "— (compute-bound)" if unit == "s" else "—"
                frac = f"{ours / roof:.1%}" if roof and not isinstance(ours, str) else "—"
                print(f"| {fig} | {policy} | {mode} | {cells.value(ours, unit)} | {cells.value(hf, unit)} | "
                      f"{cells.speed_ratio(ours, hf, unit)} | {roof_cell} | {frac} | {vs_fast} |")
    print()
    for k, note in enumerate(cells.notes, 1):
        print(f"[{k}] {note}")
    print("ours vs HF, deterministic vs fast: how many times faster the first is (> 1: faster). "
          "HF eager runs the dense bf16 experts for both dtype rows.")
    for (policy, mode), r in results.items():
        for B in args.generate_batches if args.new_tokens else ():
            g, d = r.get(f"generate b={B}"), r.get(f"decode b={B}")
            if isinstance(g, float) and isinstance(d, float):
                print(f"generate vs decode step, b={B}, {policy} {mode}: {g / d:.3f}x "
                      f"(generate {g:,.0f} tok/s end to end, decode step {d:,.0f} tok/s)")
    print(f"roofline = batch x copy bandwidth / weight bytes per step (KV cache not counted); "
          + "; ".join(roofline_notes))


def main(argv=None):
    """The steps in order: settings, header, HF's side, the engine's, the table. Exit 3 when the
    engine and HF disagree on the same weights."""
    run = parse_args(argv)
    print_header(run, argv)
    work = Workload(run.config, run.args, run.device)
    run.meter = Meter(run.device)
    floats, packed = random_weights(run.config, run.device)
    hf_side = measure_hf_side(run, work, floats, packed)
    measure_engine_side(run, work, floats, packed, hf_side)
    del floats, packed, hf_side
    free_memory(run.device)
    print_table(run)
    if not run.mapping_ok:
        print("WEIGHTS MAPPING CHECK FAILED: the engine and HF disagree on the same weights (see above)")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
