"""Spec kind `kernel`: one Triton kernel at one shape, against its plain-torch reference.

    kind: kernel
    description: …
    inputs:
      kernel: attention        # matmul | attention | rmsnorm | rope | router_top_k | swiglu | moe | sampling
      shape: {T: 4, Hq: 8, Hkv: 1, D: 64, S: 576, window: 128}    # the dims the kernel needs (below)
      positions: [190, 191, 255, 519]   # attention: query positions (IntSeq; slot 0, T = count)
      dtype: fp32              # fp32 | bf16 (float inputs; sampling is always float64)
      seed: 0                  # torch.Generator seed of the inputs
      scale: 1.0               # inputs times this (very large / small values)
      sink: 80.0               # attention: every sink logit (default: random); null sinks: -.inf
      ties: 3                  # router_top_k: logits rounded into [-ties, ties] (many ties)
      rows:                    # sampling: one key per row, and optionally the row's only finite logits
        - {seed: 12, position: 6003106, logits: {6: 0.0}}   # other ids -inf (masked)
      col_base: 0              # sampling: hash column of vocab id 0 (default SAMPLE_COLUMNS = 2^31)
    expect:
      finite: true             # no NaN / inf in the Triton output
      tolerance: 2.0e-5        # max |triton - torch| (as float64) allowed
      batch_invariant: true    # each row computed alone equals its row in the batch, bitwise
      prefill_decode: true     # attention: each query alone (a decode step) == the batch, bitwise
      reproducible: true       # a second run gives the same bits

Shapes: matmul M, K, N | attention T (or positions), Hq, Hkv, D, S, window | rmsnorm M, N |
rope T, H, D | router_top_k T, E, k | swiglu M, I | moe T, H, I, E, k | sampling R, V.
The golden holds the Triton output (tensor `out`), stored per platform as
`<platform>-triton`. Failures name the kernel and the shape.
"""

from __future__ import annotations

import math

import torch

from harness.intseq import IntSeq, length, materialize
from harness.result import Result
from harness.schema import Any_, Bool, Field, Float, Int, List, Map, Problem, Str

NAME = "kernel"
KERNELS = ("matmul", "attention", "rmsnorm", "rope", "router_top_k", "swiglu", "moe", "sampling")
DIMS = {
    "matmul": ("M", "K", "N"), "attention": ("Hq", "Hkv", "D", "S", "window"), "rmsnorm": ("M", "N"),
    "rope": ("T", "H", "D"), "router_top_k": ("T", "E", "k"), "swiglu": ("M", "I"),
    "moe": ("T", "H", "I", "E", "k"), "sampling": ("R", "V"),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

INPUTS = Map({
    "kernel": Field(Str(choices=KERNELS), required=True),
    "shape": Field(Map({d: Field(Int(min=0 if d == "window" else 1, max=1 << 20))
                        for d in ("M", "K", "N", "T", "Hq", "Hkv", "D", "S", "window", "H", "E", "k", "I", "R", "V")}),
                   required=True),
    "positions": Field(IntSeq(min_value=0), doc="attention: query positions"),
    "dtype": Field(Str(choices=DTYPES), default="fp32"),
    "seed": Field(Int(min=0), default=0),
    "scale": Field(Float(), default=1.0),
    "sink": Field(Float(), doc="attention: every sink logit"),
    "ties": Field(Int(min=1), doc="router_top_k: round logits into [-ties, ties]"),
    "rows": Field(List(Map({
        "seed": Field(Int(min=-(2**63), max=2**63 - 1), required=True),
        "position": Field(Int(min=0, max=2**63 - 1), required=True),
        "logits": Field(Any_(), doc="{vocab id: logit}: the row's only finite logits (the rest masked)"),
    }), min_len=1), doc="sampling: each row's key (and logits)"),
    "col_base": Field(Int(min=0, max=2**32 - 1), doc="sampling: the hash column of vocab id 0"),
})
EXPECT = Map({
    "finite": Field(Bool(), default=False),
    "tolerance": Field(Float(), doc="max |triton - torch| allowed"),
    "batch_invariant": Field(Bool(), default=False),
    "prefill_decode": Field(Bool(), default=False),
    "reproducible": Field(Bool(), default=False),
})


def validate(doc: dict) -> list[Problem]:
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
    if kernel == "attention" and shape["Hq"] % shape["Hkv"]:
        out.append(Problem(("inputs", "shape"), f"Hq = {shape['Hq']} is not a multiple of Hkv = {shape['Hkv']}"))
    if kernel == "attention" and inp["positions"] is not None and shape.get("T") not in (None, length(inp["positions"])):
        out.append(Problem(("inputs", "shape", "T"), "T must equal the number of positions"))
    if kernel in ("router_top_k", "moe") and shape["k"] > shape["E"]:
        out.append(Problem(("inputs", "shape", "k"), f"k = {shape['k']} exceeds E = {shape['E']}"))
    if kernel == "rope" and shape["D"] % 2:
        out.append(Problem(("inputs", "shape", "D"), "D must be even"))
    if exp.get("prefill_decode") and kernel != "attention":
        out.append(Problem(("expect", "prefill_decode"), "only the attention kernel has prefill and decode", at_key=True))
    for name, allowed in (("sink", "attention"), ("positions", "attention"), ("ties", "router_top_k"),
                          ("rows", "sampling"), ("col_base", "sampling")):
        if inp[name] is not None and kernel != allowed:
            out.append(Problem(("inputs", name), f"only for kernel {allowed}", at_key=True))
    if kernel == "sampling" and inp["rows"] is not None:
        if len(inp["rows"]) != shape["R"]:
            out.append(Problem(("inputs", "rows"), f"expected R = {shape['R']} rows, found {len(inp['rows'])}"))
        for i, row in enumerate(inp["rows"]):
            lg = row["logits"]
            if lg is None:
                continue
            if not isinstance(lg, dict) or not lg or any(isinstance(k, bool) or not isinstance(k, int)
                                                         or not 0 <= k < shape["V"] for k in lg) \
                    or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in lg.values()):
                out.append(Problem(("inputs", "rows", i, "logits"), f"expected a mapping of vocab ids in "
                                                                    f"[0, {shape['V']}) to numbers"))
    return out


def golden_platform(spec, ctx) -> str:
    return ctx.platform.name + "-triton"


def describe(spec) -> str:
    inp = spec.inputs
    dims = ", ".join(f"{k}={v}" for k, v in inp["shape"].items() if v is not None)
    return f"kernel {inp['kernel']} [{dims}] {inp['dtype']}"


# --------------------------------------------------------------------------- inputs and calls
def _inputs(spec, device):
    """-> (call(backend, rows=None) -> output tensor, rows in the batch, row dim of the output)."""
    inp, s = spec.inputs, spec.inputs["shape"]
    g = torch.Generator().manual_seed(inp["seed"])
    dt, sc = DTYPES[inp["dtype"]], inp["scale"]

    def rnd(*shape, scale=1.0, dtype=None):
        return (torch.randn(*shape, generator=g) * scale).to(dtype or dt).to(device)

    k = inp["kernel"]
    if k == "matmul":
        from kernels.matmul import linear
        x, w, b = rnd(s["M"], s["K"], scale=sc), rnd(s["N"], s["K"], scale=s["K"] ** -0.5), rnd(s["N"])
        return (lambda be, r=slice(None): linear(x[r], w, b, backend=be)), s["M"]
    if k == "rmsnorm":
        from kernels.rmsnorm import rms_norm
        x, w = rnd(s["M"], s["N"], scale=sc), rnd(s["N"])
        return (lambda be, r=slice(None): rms_norm(x[r], w, 1e-5, backend=be)), s["M"]
    if k == "rope":
        from kernels.rope import apply_rope
        x, ang = rnd(s["T"], s["H"], s["D"], scale=sc), rnd(s["T"], s["D"] // 2, scale=100.0, dtype=torch.float32)
        cos, sin = ang.cos() * 1.3466, ang.sin() * 1.3466
        return (lambda be, r=slice(None): apply_rope(x[r], cos[r], sin[r], backend=be)), s["T"]
    if k == "router_top_k":
        from kernels.moe import router_top_k
        logits = rnd(s["T"], s["E"], scale=4 * sc, dtype=torch.float32)
        if inp["ties"]:
            logits = logits.round().clamp(-inp["ties"], inp["ties"])
        logits = logits.to(dt)

        def call(be, r=slice(None)):
            w, ids = router_top_k(logits[r], s["k"], backend=be)
            return torch.cat([w.to(torch.float64), ids.to(torch.float64)], dim=1)   # [T, 2k]
        return call, s["T"]
    if k == "swiglu":
        from kernels.moe import clamped_swiglu
        x = rnd(s["M"], 2 * s["I"], scale=8 * sc)
        return (lambda be, r=slice(None): clamped_swiglu(x[r], backend=be)), s["M"]
    if k == "moe":
        from kernels.moe import moe, router_top_k
        T, H, I, E, kk = s["T"], s["H"], s["I"], s["E"], s["k"]
        x = rnd(T, H, scale=sc)
        W = (rnd(E, 2 * I, H, scale=H ** -0.5), rnd(E, 2 * I), rnd(E, H, I, scale=I ** -0.5), rnd(E, H))
        routing, ids = router_top_k(rnd(T, E, dtype=torch.float32), kk)
        return (lambda be, r=slice(None): moe(x[r], routing[r], ids[r], *W, backend=be)), T
    if k == "sampling":
        from kernels.sampling import SAMPLE_COLUMNS, gumbel_argmax
        z = rnd(s["R"], s["V"], scale=2 * sc, dtype=torch.float64)
        seeds = torch.randint(-(1 << 62), 1 << 62, (s["R"],), generator=g).to(device)
        pos = torch.randint(0, 1 << 20, (s["R"],), generator=g).to(device)
        if inp["rows"] is not None:                                   # written keys (and logits)
            seeds = torch.tensor([row["seed"] for row in inp["rows"]], dtype=torch.int64, device=device)
            pos = torch.tensor([row["position"] for row in inp["rows"]], dtype=torch.int64, device=device)
            for i, row in enumerate(inp["rows"]):
                if row["logits"] is not None:
                    z[i] = float("-inf")
                    for v, x in row["logits"].items():
                        z[i, v] = float(x)
        logp = torch.log_softmax(z, -1)
        base = SAMPLE_COLUMNS if inp["col_base"] is None else inp["col_base"]
        return (lambda be, r=slice(None): gumbel_argmax(logp[r], seeds[r], pos[r], base, backend=be)), s["R"]
    if k == "attention":
        from kernels.attention import attention
        Hq, Hkv, D, S, W = s["Hq"], s["Hkv"], s["D"], s["S"], s["window"]
        pos = materialize(inp["positions"]) if inp["positions"] is not None else \
            torch.randint(0, S, (s["T"],), generator=g)
        T = pos.shape[0]
        kc, vc = rnd(1, Hkv, S, D), rnd(1, Hkv, S, D)
        q = rnd(T, Hq, D, scale=sc)
        sinks = (torch.full((Hq,), inp["sink"]) if inp["sink"] is not None else torch.randn(Hq, generator=g)).to(device)
        pos, slots = pos.to(device), torch.zeros(T, dtype=torch.int64, device=device)
        return (lambda be, r=slice(None): attention(q[r], kc, vc, slots[r], pos[r], sinks, W, D ** -0.5,
                                                    backend=be)), T
    raise ValueError(f"unknown kernel {k!r}")


def _first(mask: torch.Tensor) -> list[int]:
    return mask.nonzero()[0].tolist()


def run(spec, ctx) -> Result:
    exp = spec.expect
    call, rows = _inputs(spec, ctx.device)
    out = call("triton")
    where = describe(spec)
    failures: list[str] = []
    if exp.get("finite"):
        bad = ~torch.isfinite(out.to(torch.float64))
        if bad.any():
            failures.append(f"{where}: {int(bad.sum())} non-finite values in the Triton output, first at {_first(bad)}")
    if exp.get("tolerance") is not None:
        ref = call("torch")
        err = (out.to(torch.float64) - ref.to(torch.float64)).abs().nan_to_num(nan=math.inf)
        if err.numel() and float(err.max()) > exp["tolerance"]:
            failures.append(f"{where}: max |triton - torch| = {float(err.max()):.3g} at {_first(err == err.max())}, "
                            f"above the tolerance {exp['tolerance']:.3g}")
    for key, what in (("batch_invariant", "row alone"), ("prefill_decode", "decode step (query alone)")):
        if exp.get(key):
            for r in sorted({0, rows // 2, rows - 1}):
                one = call("triton", slice(r, r + 1))
                if not one.contiguous().view(torch.uint8).equal(out[r:r + 1].contiguous().view(torch.uint8)):
                    failures.append(f"{where}: {what} differs bitwise from row {r} of the batch of {rows}")
                    break
    if exp.get("reproducible"):
        again = call("triton")
        if not again.contiguous().view(torch.uint8).equal(out.contiguous().view(torch.uint8)):
            failures.append(f"{where}: a second run gave different bits")
    return Result(tensors={"out": out.cpu()}, data={"failures": failures})


def check(spec, result: Result) -> list[str]:
    return list(result.data.get("failures", []))
