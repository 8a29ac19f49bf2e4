"""Spec kind `kernel`: one Triton kernel at one shape, against its bit-exact torch reference.

    kind: kernel
    description: …
    inputs:
      kernel: attention        # matmul | attention | rmsnorm | rope | router_top_k | swiglu | experts | sampling
      shape: {T: 4, Hq: 8, Hkv: 1, D: 64, S: 576, window: 128}    # the dims the kernel needs (below)
      positions: [190, 191, 255, 519]   # attention: query positions (IntSeq; slot 0, T = count)
      dtype: fp32              # fp32 | bf16 (float inputs; sampling is always float64)
      seed: 0                  # torch.Generator seed of the inputs
      scale: 1.0               # inputs times this (very large / small values)
      sink: 80.0               # attention: every sink logit (default: random); null sinks: -.inf
      ties: 3                  # router_top_k: logits rounded into [-ties, ties] (many ties)
      rows:                    # sampling: one key per row, and optionally the row's only finite logits
        - {seed: 12, position: 6003106, logits: {'6': 0.0}}   # other ids -inf (masked)
      col_base: 0              # sampling: hash column of vocab id 0 (default SAMPLE_COLUMNS = 2^31)
      experts_used: 3          # experts: every token's k experts drawn from the first 3 (the rest get no row)
      mxfp4: true              # experts: the weights MXFP4 packed (H and I multiples of 32)
    expect:
      finite: true             # no NaN / inf in the Triton output
      tolerance: 2.0e-5        # max |triton - torch| (as float64) allowed
      batch_invariant: true    # each row computed alone equals its row in the batch, bitwise
      prefill_decode: true     # attention: each query alone (a decode step) == the batch, bitwise
      reproducible: true       # a second run gives the same bits

Shapes: matmul M, K, N | attention T (or positions), Hq, Hkv, D, S, window | rmsnorm M, N |
rope T, H, D | router_top_k T, E, k | swiglu M, I | experts T, H, I, E, k |
sampling R, V. `experts` is the engine's grouped expert path as it runs (engine.experts.experts_grouped:
group_by_expert, the grouped gate_up, the SwiGLU, the grouped down over the 8 fixed K chunks), its
output each (token, slot)'s down partials [T, k * 8 * H]. The kernel runs as the target's
operation of the same name (Lockstep's engine: each kernel module's `_triton` kernel,
harness/targets/lockstep_run.py) against the op's one torch reference on the same inputs: the
kernel module's bit-exact `_portable` function, the one the torch ops table runs (experts:
engine.experts.experts_per_row; sample_fused: engine.sampling's torch path; docs/engine.md lists them).
The golden holds Lockstep's Triton output (tensor `out`), stored per platform as
`<platform>-triton`. Failures name the target, the kernel and the shape.
"""

from __future__ import annotations

import functools
import math

import torch

from lockstep.harness.intseq import IntSeq, length, materialize
from lockstep.harness.limits import MAX_KERNEL_ELEMENTS
from lockstep.kernels import portable
from lockstep.harness.result import Result
from lockstep.harness.schema import Any_, Bool, Field, Float, Int, List, Map, Problem, Str
from lockstep.harness.targets.base import TOLERANCE, NotApplicable, TargetInterface
from lockstep.kernels.attention import KV_TILE

NAME = "kernel"
KERNELS = ("matmul", "attention", "rmsnorm", "rope", "router_top_k", "swiglu", "experts", "sampling", "sample_fused")
DIMS = {
    "matmul": ("M", "K", "N"), "attention": ("Hq", "Hkv", "D", "S", "window"), "rmsnorm": ("M", "N"),
    "rope": ("T", "H", "D"), "router_top_k": ("T", "E", "k"), "swiglu": ("M", "I"),
    "experts": ("T", "H", "I", "E", "k"), "sampling": ("R", "V"), "sample_fused": ("R", "V"),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

INPUTS = Map({
    "kernel": Field(Str(choices=KERNELS), required=True),
    "shape": Field(Map({d: Field(Int(min=0 if d == "window" else 1, max=1 << 20))
                        for d in ("M", "K", "N", "T", "Hq", "Hkv", "D", "S", "window", "H", "E", "k", "I", "R", "V")}),
                   required=True),
    "positions": Field(IntSeq(min_value=0), doc="attention: query positions"),
    "dtype": Field(Str(choices=DTYPES), default="fp32"),
    "seed": Field(Int(min=0, max=2**64 - 1), default=0),
    "scale": Field(Float(), default=1.0),
    "sink": Field(Float(allow_inf=True), doc="attention: every sink logit (-.inf: no sink)"),
    "ties": Field(Int(min=1), doc="router_top_k: round logits into [-ties, ties]"),
    "rows": Field(List(Map({
        "seed": Field(Int(min=-(2**63), max=2**63 - 1), required=True),
        "position": Field(Int(min=0, max=2**63 - 1), required=True),
        "logits": Field(Any_(), doc="{vocab id: logit}: the row's only finite logits (the rest masked)"),
        "fill": Field(Any_(), doc="sample_fused: every unlisted logit (default: random)"),
        "params": Field(Any_(), doc="sample_fused: the row's SamplingParams fields (default: greedy)"),
    }), min_len=1), doc="sampling, sample_fused: each row's key (and logits)"),
    "col_base": Field(Int(min=0, max=2**32 - 1), doc="sampling: the hash column of vocab id 0"),
    "experts_used": Field(Int(min=1), doc="experts: the tokens' experts drawn from the first n"),
    "mxfp4": Field(Bool(), default=False, doc="experts: MXFP4-packed weights"),
})
EXPECT = Map({
    "finite": Field(Bool(), default=False),
    "tolerance": Field(Float(min=0.0), doc="max |triton - torch| allowed (finite, >= 0)"),
    "batch_invariant": Field(Bool(), default=False),
    "prefill_decode": Field(Bool(), default=False),
    "reproducible": Field(Bool(), default=False),
    "bitwise": Field(Bool(), default=False, doc="the Triton output has the torch reference's bits"),
})


def validate(doc: dict, root=None) -> list[Problem]:
    inp, exp = doc["inputs"], doc["expect"] or {}
    kernel, shape = inp["kernel"], inp["shape"] or {}
    out = []
    need = list(DIMS.get(kernel, ()))
    if kernel == "attention" and inp["positions"] is None:
        need.append("T")
    for d in need:
        if shape.get(d) is None:
            out.append(Problem(("inputs", "shape"), f"missing required key {d!r} (kernel {kernel} needs {need})"))
    for d, v in shape.items():
        if v is not None and d not in need and not (kernel == "attention" and d == "T"):
            out.append(Problem(("inputs", "shape", d), f"not a dimension of kernel {kernel} (it has {need})", at_key=True))
    if out:
        return out
    size = elements(kernel, {**shape, "T": length(inp["positions"]) if inp["positions"] is not None else shape.get("T")})
    if size > MAX_KERNEL_ELEMENTS:
        out.append(Problem(("inputs", "shape"), f"kernel {kernel} at this shape allocates about {size:,} elements "
                                                f"(inputs, weights, output), more than {MAX_KERNEL_ELEMENTS:,}"))
    if kernel == "attention" and shape["Hq"] % shape["Hkv"]:
        out.append(Problem(("inputs", "shape"), f"Hq = {shape['Hq']} is not a multiple of Hkv = {shape['Hkv']}"))
    if kernel == "attention" and shape["S"] % KV_TILE:
        out.append(Problem(("inputs", "shape", "S"), f"S = {shape['S']} is not a multiple of {KV_TILE} (the torch "
                                                     f"reference's tile; a KV cache's capacity always is)"))
    if kernel == "attention" and inp["positions"] is not None and shape.get("T") not in (None, length(inp["positions"])):
        out.append(Problem(("inputs", "shape", "T"), "T must equal the number of positions"))
    if kernel in ("router_top_k", "experts") and shape["k"] > shape["E"]:
        out.append(Problem(("inputs", "shape", "k"), f"k = {shape['k']} exceeds E = {shape['E']}"))
    if kernel == "experts" and inp["experts_used"] is not None and not shape["k"] <= inp["experts_used"] <= shape["E"]:
        out.append(Problem(("inputs", "experts_used"), f"must be in [k, E] = [{shape['k']}, {shape['E']}]"))
    if kernel == "experts" and inp["mxfp4"] and (shape["H"] % 32 or shape["I"] % 32):
        out.append(Problem(("inputs", "mxfp4"), "MXFP4 blocks need H and I to be multiples of 32"))
    if kernel == "rope" and shape["D"] % 2:
        out.append(Problem(("inputs", "shape", "D"), "D must be even"))
    if inp["mxfp4"] and kernel != "experts":
        out.append(Problem(("inputs", "mxfp4"), "only for kernel experts", at_key=True))
    if exp.get("prefill_decode") and kernel != "attention":
        out.append(Problem(("expect", "prefill_decode"), "only the attention kernel has prefill and decode", at_key=True))
    for name, allowed in (("sink", "attention"), ("positions", "attention"), ("ties", "router_top_k"),
                          ("rows", "sampling"), ("col_base", "sampling"), ("experts_used", "experts")):
        if inp[name] is not None and kernel != allowed and not (name == "rows" and kernel == "sample_fused"):
            out.append(Problem(("inputs", name), f"only for kernel {allowed}", at_key=True))
    if kernel in ("sampling", "sample_fused") and inp["rows"] is not None:
        if len(inp["rows"]) != shape["R"]:
            out.append(Problem(("inputs", "rows"), f"expected R = {shape['R']} rows, found {len(inp['rows'])}"))
        for i, row in enumerate(inp["rows"]):
            lg = row["logits"]
            if lg is None:
                continue
            if not isinstance(lg, dict) or not lg or any(not _vocab_key(k, shape["V"]) for k in lg) \
                    or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in lg.values()):
                out.append(Problem(("inputs", "rows", i, "logits"), f"expected a mapping of vocab ids in "
                                                                    f"[0, {shape['V']}), written as quoted "
                                                                    f"keys ('6': 0.0), to numbers"))
    return out


def elements(kernel: str, s: dict) -> int:
    """About how many elements a run of the kernel allocates at shape `s`, references included
    (the attention reference gathers every query's keys and values: 2 T Hkv S D)."""
    if kernel == "matmul":
        return s["M"] * s["K"] + s["N"] * s["K"] + s["N"] + 2 * s["M"] * s["N"]
    if kernel == "attention":
        T, Hq, Hkv, D, S = s["T"], s["Hq"], s["Hkv"], s["D"], s["S"]
        return 2 * T * Hq * D + 2 * Hkv * S * D + 2 * T * Hkv * S * D + 2 * T * Hq * S
    if kernel == "rmsnorm":
        return 3 * s["M"] * s["N"] + s["N"]
    if kernel == "rope":
        return 3 * s["T"] * s["H"] * s["D"] + s["T"] * s["D"]
    if kernel == "router_top_k":
        return 2 * s["T"] * s["E"] + 4 * s["T"] * s["k"]
    if kernel == "swiglu":
        return 5 * s["M"] * s["I"]
    if kernel == "experts":
        T, H, I, E, k = s["T"], s["H"], s["I"], s["E"], s["k"]
        return 2 * T * H + 4 * E * H * I + 3 * E * I + E * H + T * E + T * k * (3 * I + 3 * H) + 2 * 8 * T * k * H
    if kernel == "sampling":
        return 3 * s["R"] * s["V"]
    if kernel == "sample_fused":
        return 8 * s["R"] * s["V"]
    raise ValueError(f"unknown kernel {kernel!r}")


def golden_platform(spec, ctx) -> str:
    return ctx.fixed_platform + "-triton"      # the dtype policy does not apply: inputs name theirs


def _vocab_key(key, V: int) -> bool:
    """A vocab id written as a mapping key: a quoted decimal integer (YAML keys must be strings)."""
    return isinstance(key, str) and key.isdigit() and int(key) < V


def describe(spec) -> str:
    inp = spec.inputs
    dims = ", ".join(f"{k}={v}" for k, v in inp["shape"].items() if v is not None)
    return f"kernel {inp['kernel']} [{dims}] {inp['dtype']}"


# --------------------------------------------------------------------------- inputs and calls
def kernel_inputs(spec, device) -> dict:
    """The input tensors of a spec, from the spec's seed: what the target's kernel operation and the
    torch reference are called with. attention: q [T, Hq, D], k and v [S, Hkv, D], positions [T],
    sinks [Hq], window, scale; rmsnorm: x [M, N], weight [N]; sampling: logp [R, V] float64,
    seeds [R], positions [R], col_base; the others as `_call` below passes them."""
    inp, s = spec.inputs, spec.inputs["shape"]
    g = torch.Generator().manual_seed(inp["seed"])
    dt, sc, k = DTYPES[inp["dtype"]], inp["scale"], inp["kernel"]

    def rnd(*shape, scale=1.0, dtype=None):
        return (portable.normal(shape, g) * scale).to(dtype or dt).to(device)   # randn is not portable

    if k == "matmul":
        return {"x": rnd(s["M"], s["K"], scale=sc), "w": rnd(s["N"], s["K"], scale=s["K"] ** -0.5), "b": rnd(s["N"])}
    if k == "rmsnorm":
        return {"x": rnd(s["M"], s["N"], scale=sc), "weight": rnd(s["N"])}
    if k == "rope":
        x, ang = rnd(s["T"], s["H"], s["D"], scale=sc), rnd(s["T"], s["D"] // 2, scale=100.0, dtype=torch.float32)
        sin, cos = portable.sincos64(ang)
        return {"x": x, "cos": cos.to(torch.float32) * 1.3466, "sin": sin.to(torch.float32) * 1.3466}
    if k == "router_top_k":
        logits = rnd(s["T"], s["E"], scale=4 * sc, dtype=torch.float32)
        if inp["ties"]:
            logits = logits.round().clamp(-inp["ties"], inp["ties"])
        return {"logits": logits.to(dt), "k": s["k"]}
    if k == "swiglu":
        return {"x": rnd(s["M"], 2 * s["I"], scale=8 * sc)}
    if k == "experts":
        return _experts_inputs(inp, s, rnd, g)
    if k == "sample_fused":
        return _sample_fused_inputs(inp, s, rnd, device)
    if k == "sampling":
        return _sampling_inputs(inp, s, rnd, g, device)
    if k == "attention":
        Hq, Hkv, D, S = s["Hq"], s["Hkv"], s["D"], s["S"]
        pos = materialize(inp["positions"]) if inp["positions"] is not None else \
            torch.randint(0, S, (s["T"],), generator=g)
        kc, vc = rnd(1, Hkv, S, D), rnd(1, Hkv, S, D)
        q = rnd(pos.shape[0], Hq, D, scale=sc)
        sinks = (torch.full((Hq,), inp["sink"]) if inp["sink"] is not None else portable.normal((Hq,), g)).to(device)
        return {"q": q, "k": kc[0].transpose(0, 1), "v": vc[0].transpose(0, 1), "positions": pos.to(device),
                "sinks": sinks, "window": s["window"], "scale": D ** -0.5}
    raise ValueError(f"unknown kernel {k!r}")


def _sampling_inputs(inp, s, rnd, g, device) -> dict:
    from lockstep.kernels.sampling import SAMPLE_COLUMNS
    z = rnd(s["R"], s["V"], scale=2 * inp["scale"], dtype=torch.float64)
    seeds = torch.randint(-(1 << 62), 1 << 62, (s["R"],), generator=g).to(device)
    pos = torch.randint(0, 1 << 20, (s["R"],), generator=g).to(device)
    if inp.get("rows") is not None:                               # written keys (and logits)
        seeds = torch.tensor([row["seed"] for row in inp["rows"]], dtype=torch.int64, device=device)
        pos = torch.tensor([row["position"] for row in inp["rows"]], dtype=torch.int64, device=device)
        for i, row in enumerate(inp["rows"]):
            if row["logits"] is not None:
                z[i] = float("-inf")
                for v, x in row["logits"].items():
                    z[i, int(v)] = float(x)
    base = SAMPLE_COLUMNS if inp.get("col_base") is None else inp["col_base"]
    return {"logp": portable.log_softmax(z, -1), "seeds": seeds, "positions": pos, "col_base": base}


def _experts_inputs(inp, s, rnd, g) -> dict:
    """The grouped expert path's inputs: x [T, H], every token's k distinct experts, the weights
    (MXFP4-packed with `mxfp4`: the kernels decode in their tile loads)."""
    from lockstep.kernels.mxfp4 import quantize
    T, H, I, E, kk = s["T"], s["H"], s["I"], s["E"], s["k"]
    x = rnd(T, H, scale=inp["scale"])
    gu_w, dn_w = rnd(E, 2 * I, H, scale=H ** -0.5), rnd(E, H, I, scale=I ** -0.5)
    gu_b = rnd(E, 2 * I, dtype=torch.float32)
    if inp["mxfp4"]:
        gu_w, dn_w = (tuple(t.to(x.device) for t in quantize(w.cpu())) for w in (gu_w, dn_w))
    used = inp["experts_used"] or E
    ids = torch.stack([torch.randperm(used, generator=g)[:kk] for _ in range(T)]).to(x.device)   # [T, k] distinct
    return {"x": x, "ids": ids, "gate_up_w": gu_w, "gate_up_b": gu_b, "down_w": dn_w, "alpha": 1.702, "limit": 7.0}


def _sample_fused_inputs(inp, s, rnd, device) -> dict:
    """Rows written in the spec (logits [R, V] float32, each row's SamplingParams, seed, position)."""
    from lockstep.engine.sampling import SamplingParams
    rows, V = inp["rows"] or [{"seed": i, "position": i} for i in range(s["R"])], s["V"]
    x = rnd(len(rows), V, scale=3.0 * inp["scale"], dtype=torch.float32)
    for i, row in enumerate(rows):
        if row.get("fill") is not None:
            x[i] = row["fill"]
        for v, val in (row.get("logits") or {}).items():
            x[i, int(v)] = float(val)
    return {"logits": x, "params": [SamplingParams(**(row.get("params") or {"greedy": True})) for row in rows],
            "seeds": [row["seed"] for row in rows],
            "positions": torch.tensor([row["position"] for row in rows], dtype=torch.int64, device=device)}


def _call(k: str, op, x: dict, col_base: bool):
    """call(rows) -> the target's output on those rows of the inputs (all rows by default), in the
    form the reference has. `col_base`: the sampling operation takes the spec's column base."""
    if k == "matmul":
        return lambda r=slice(None): op(x["x"][r], x["w"], x["b"])
    if k == "rmsnorm":
        return lambda r=slice(None): op(x["x"][r], x["weight"], 1e-5)
    if k == "rope":
        return lambda r=slice(None): op(x["x"][r], x["cos"][r], x["sin"][r])
    if k == "router_top_k":
        return lambda r=slice(None): _top_k_rows(*op(x["logits"][r], x["k"]))
    if k == "swiglu":
        return lambda r=slice(None): op(x["x"][r])
    if k == "experts":
        return lambda r=slice(None): _partials_rows(op(x["x"][r], x["ids"][r], x["gate_up_w"], x["gate_up_b"],
                                                       x["down_w"], x["alpha"], x["limit"]), x)
    if k == "sample_fused":
        return lambda r=slice(None): _sampled_rows(*op(x["logits"][r], x["params"][r], x["seeds"][r],
                                                       x["positions"][r]))
    if k == "sampling":
        kw = {"col_base": x["col_base"]} if col_base else {}
        return lambda r=slice(None): op(x["logp"][r], x["seeds"][r], x["positions"][r], **kw)
    return lambda r=slice(None): op(x["q"][r], x["k"], x["v"], x["positions"][r], x["sinks"], x["window"],
                                    x["scale"])


def _top_k_rows(w, ids):
    return torch.cat([w.to(torch.float64), ids.to(torch.float64)], dim=1)   # [T, 2k]


def _partials_rows(parts, x):
    """[chunks, rows * k, H] -> [rows, k * chunks * H]: each (token, slot)'s down partials, chunk-major."""
    rows, kk, H = parts.shape[1] // x["ids"].shape[1], x["ids"].shape[1], x["x"].shape[1]
    return parts.view(parts.shape[0], rows, kk, H).permute(1, 2, 0, 3).reshape(rows, -1)


def _sampled_rows(tok, lp, dist):
    """[rows, 2 + V] int64: the token, the chosen logprob's bits, the bits of the row's target
    distribution. Every NaN is written as one NaN: which NaN an operation on NaNs returns (sign,
    payload) is the hardware's and the library's choice (x86 keeps an operand's, a GPU gives its
    own), so the contract is that a value is NaN where the torch path's is, not its NaN bits."""
    lp, dist = (torch.where(t.isnan(), math.nan, t) for t in (lp, dist))
    return torch.cat([tok[:, None], lp.view(torch.int32).to(torch.int64)[:, None], dist.view(torch.int64)], 1)


def reference(spec, x: dict) -> torch.Tensor:
    """The op's one torch reference on `kernel_inputs(spec, …)`: the kernel module's bit-exact
    `_portable` function as the torch ops table calls it (experts: engine.experts.experts_per_row;
    sample_fused and sampling: the torch paths)."""
    k = spec.inputs["kernel"]
    if k == "matmul":
        from lockstep.kernels.matmul import linear_portable
        return linear_portable(x["x"], x["w"], x["b"])
    if k == "rmsnorm":
        from lockstep.kernels.rmsnorm import rms_norm_portable
        return rms_norm_portable(x["x"], x["weight"], 1e-5, out_dtype=x["x"].dtype)
    if k == "rope":
        from lockstep.kernels.rope import apply_rope_portable                # the model's call: fp32, rounded once
        return apply_rope_portable(x["x"].to(torch.float32), x["cos"], x["sin"]).to(x["x"].dtype)
    if k == "router_top_k":
        from lockstep.kernels.moe import router_top_k_portable
        return _top_k_rows(*router_top_k_portable(x["logits"], x["k"]))
    if k == "swiglu":
        from lockstep.kernels.moe import clamped_swiglu_portable
        return clamped_swiglu_portable(x["x"])
    if k == "experts":
        return _partials_rows(_experts_portable(x), x)
    if k == "sample_fused":
        return _sampled_rows(*_sample_torch(x))
    if k == "sampling":
        from lockstep.kernels.sampling import gumbel_argmax_torch
        return gumbel_argmax_torch(x["logp"], x["seeds"], x["positions"], x["col_base"])
    from lockstep.kernels.attention import attention_portable
    q = x["q"]
    kc, vc = x["k"].transpose(0, 1)[None], x["v"].transpose(0, 1)[None]
    return attention_portable(q, kc, vc, torch.zeros(q.shape[0], dtype=torch.int64, device=q.device),
                              x["positions"], x["sinks"], x["window"], x["scale"])


def _experts_portable(x: dict) -> torch.Tensor:
    """The torch ops' experts (engine.experts.experts_per_row: the same contract per row, portable
    matmuls) on the spec's inputs: [chunks, T * k, H]."""
    from lockstep.engine.experts import experts_per_row
    from lockstep.engine.linear import k_chunk_bounds
    from lockstep.engine.mxfp4 import Mxfp4Weight
    gu, dn = (Mxfp4Weight(*w) if isinstance(w, tuple) else w for w in (x["gate_up_w"], x["down_w"]))
    E = x["gate_up_b"].shape[0]
    return experts_per_row(x["x"], x["ids"], gu, x["gate_up_b"], dn, k_chunk_bounds(x["gate_up_b"].shape[1] // 2),
                           0, E, x["alpha"], x["limit"])


def _sample_torch(x: dict):
    """lockstep.engine.sampling's torch path: (tokens, chosen logprobs, target distributions; greedy rows at
    temperature 1)."""
    from lockstep.engine.sampling import SamplingParams, chosen_logprobs, row_settings, sample_with, target_distributions
    logits, params = x["logits"], x["params"]
    tok = sample_with(logits, row_settings(params, x["seeds"], logits.device), x["positions"], fused=False)
    dist = target_distributions(logits, [SamplingParams() if p.is_greedy else p for p in params], fused=False)
    return tok, chosen_logprobs(logits, tok, fused=False), dist


def _first(mask: torch.Tensor) -> list[int]:
    return mask.nonzero()[0].tolist()


def run(spec, ctx, target: TargetInterface) -> Result:
    """The target's operation for the spec's kernel (Lockstep's engine: its Triton kernel) against
    the torch reference on the same inputs."""
    k = spec.inputs["kernel"]
    op = _kernel_op(spec, target, str(ctx.device))
    x = kernel_inputs(spec, ctx.device)
    result = _measure(spec, _call(k, op, x, target.offers(k, "col_base")),
                      functools.cache(lambda: reference(spec, x)), None, "", f"{target.name} - reference")
    result.data["failures"] = [f"{target.name}: {f}" for f in result.data["failures"]]
    return result


def _kernel_op(spec, t: TargetInterface, device: str):
    """The target's operation of the spec's kernel (named as the kernel); NotApplicable with the reason."""
    k = spec.inputs["kernel"]
    needs = ("col_base",) if k == "sampling" and spec.inputs.get("col_base") is not None else ()
    own = k not in INTERFACE_KERNELS          # an operation of the documented interface: the target's own reason
    return t.op(k, device, needs, why=f"kernel {k}: no target operation is defined for it (Lockstep's own kernel "
                                      f"interface)" if own else None)


INTERFACE_KERNELS = ("rmsnorm", "attention", "sampling")   # harness/targets/base.py documents these operations


def _measure(spec, call, reference, rows: int | None, output: str, difference: str) -> Result:
    """The spec's expectations of one implementation: `call(rows)` runs it (all rows by default),
    `reference()` gives the reference output; `output` and `difference` name them in failures;
    `rows` None: the output's."""
    exp = spec.expect
    out = call()
    rows = out.shape[0] if rows is None else rows
    where = describe(spec)
    failures: list[str] = []
    if exp.get("finite"):
        bad = ~torch.isfinite(out.to(torch.float64))
        if bad.any():
            failures.append(f"{where}: {int(bad.sum())} non-finite values{output}, first at {_first(bad)}")
    if exp.get("bitwise"):
        ref = reference()
        diff = out.contiguous().view(torch.uint8).reshape(out.shape[0], -1) != \
            ref.contiguous().view(torch.uint8).reshape(ref.shape[0], -1)
        if diff.any():
            failures.append(f"{where}: {output.strip() or 'the output'} differs bitwise from the reference in rows "
                            f"{sorted(set(diff.any(1).nonzero()[:, 0].tolist()))}")
    if exp.get("tolerance") is not None:
        ref = reference()
        if out.shape != ref.shape:
            failures.append(f"{where}: output shape {list(out.shape)}, the reference has {list(ref.shape)}")
        else:
            err = (out.to(torch.float64) - ref.to(torch.float64)).abs().nan_to_num(nan=math.inf)
            if err.numel() and float(err.max()) > exp["tolerance"]:
                failures.append(f"{where}: max |{difference}| = {float(err.max()):.3g} at {_first(err == err.max())}, "
                                f"above the tolerance {exp['tolerance']:.3g}")
    for key, what in (("batch_invariant", "row alone"), ("prefill_decode", "decode step (query alone)")):
        if exp.get(key):
            for r in sorted({0, rows // 2, rows - 1}):
                one = call(slice(r, r + 1))
                if not one.contiguous().view(torch.uint8).equal(out[r:r + 1].contiguous().view(torch.uint8)):
                    failures.append(f"{where}: {what} differs bitwise from row {r} of the batch of {rows}")
                    break
    if exp.get("reproducible"):
        again = call()
        if not again.contiguous().view(torch.uint8).equal(out.contiguous().view(torch.uint8)):
            failures.append(f"{where}: a second run gave different bits")
    return Result(tensors={"out": out.cpu()}, data={"failures": failures})


def applicability(spec, target: TargetInterface, device: str) -> str:
    _kernel_op(spec, target, device)
    return TOLERANCE


def compared(spec, ctx, result: Result) -> tuple[str, None]:
    """On a target, the spec's tolerance against the reference is the comparison: no golden."""
    return TOLERANCE, None


def check(spec, result: Result) -> list[str]:
    return list(result.data.get("failures", []))
