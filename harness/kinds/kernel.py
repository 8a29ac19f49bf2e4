"""Spec kind `kernel`: one Triton kernel at one shape, against its bit-exact torch reference.

    kind: kernel
    description: …
    inputs:
      kernel: attention        # a declared case (below): matmul | attention | rmsnorm | rope | … | sample_fused
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

Each kernel declares its case beside it (kernels/case.py: `CASES` at the end of its module; the
engine paths pinned as kernels in engine/cases.py): its dims (matmul M, K, N | attention T (or
positions), Hq, Hkv, D, S, window | rmsnorm M, N | rope T, H, D | router_top_k T, E, k |
swiglu M, I | experts T, H, I, E, k | sampling, sample_fused R, V), the optional inputs above it
takes, how its inputs are drawn, and its one torch reference. This kind is a loop over those
declarations. `experts` is the engine's grouped expert path as it runs (engine.experts.experts_grouped),
its output each (token, slot)'s down partials [T, k * 8 * H]. The kernel runs as the target's
operation of the same name (Lockstep's engine: the case's `op`) against the op's one torch
reference on the same inputs: the kernel module's bit-exact `_portable` function, the one the
torch ops table runs (experts: engine.experts.experts_per_row; sample_fused: engine.sampling's
torch path; docs/engine.md lists them). The golden holds Lockstep's Triton output (tensor
`out`), stored per platform as `<platform>-triton`. Failures name the target, the kernel and the shape.
A target without a kernel's own operation runs the kernel's interface form where it declares one
(`KernelCase.form`): sample_fused's tokens through the target's `sampling` with params, bitwise
against the torch path, on a target declaring the coin contract; its first failure is the cause
(the DESIGN §5 rule the row's token breaks, the row, its key and settings).
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch

from lockstep.engine.cases import every_case
from lockstep.harness.intseq import IntSeq, length, materialize
from lockstep.harness.limits import MAX_KERNEL_ELEMENTS
from lockstep.harness.result import SpecResult
from lockstep.harness.schema import Any_, Bool, Field, Float, Int, List, Map, Problem, Str, did_you_mean
from lockstep.harness.schema import describe as describe_value
from lockstep.harness.target import BITWISE, TOLERANCE, NotApplicable, TargetInterface
from lockstep.kernels.case import Draw, KernelCase

NAME = "kernel"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
OPTIONS = ("positions", "sink", "ties", "rows", "col_base", "experts_used", "mxfp4")   # a case's `options`
_ORDER = ("M", "K", "N", "T", "Hq", "Hkv", "D", "S", "window", "H", "E", "k", "I", "R", "V")   # as reports name them
SHAPE_KEYS = sorted({d for c in every_case().values() for d in c.dims + c.optional_dims},
                    key=lambda d: (_ORDER.index(d) if d in _ORDER else len(_ORDER), d))

INPUTS = Map({
    "kernel": Field(Str(), required=True, doc="a declared kernel case (cases())"),
    "shape": Field(Map({d: Field(Int(min=0 if d == "window" else 1, max=1 << 20)) for d in SHAPE_KEYS}),
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


def cases() -> dict[str, KernelCase]:
    """Every declared kernel case by name (read afresh: a module's CASES is the declaration)."""
    return every_case()


def validate(doc: dict, root=None) -> list[Problem]:
    inp, exp = doc["inputs"], doc["expect"] or {}
    known = cases()
    if inp["kernel"] not in known:
        return [Problem(("inputs", "kernel"), f"expected one of {list(known)}, found {describe_value(inp['kernel'])}"
                                              f"{did_you_mean(inp['kernel'], known)}")]
    case, shape = known[inp["kernel"]], inp["shape"] or {}
    out = _shape_problems(case, inp, shape)
    if out:
        return out
    sized = {**shape, "T": length(inp["positions"]) if inp["positions"] is not None else shape.get("T")}
    size = case.elements(sized)
    if size > MAX_KERNEL_ELEMENTS:
        out.append(Problem(("inputs", "shape"), f"kernel {case.name} at this shape allocates about {size:,} elements "
                                                f"(inputs, weights, output), more than {MAX_KERNEL_ELEMENTS:,}"))
    out += [Problem(("inputs",) + path, message) for path, message in case.problems(inp, sized)]
    if inp["positions"] is not None and shape.get("T") not in (None, length(inp["positions"])):
        out.append(Problem(("inputs", "shape", "T"), "T must equal the number of positions"))
    for name in OPTIONS:
        if inp[name] is not None and inp[name] is not False and name not in case.options:   # mxfp4 defaults to False
            out.append(Problem(("inputs", name), f"only for kernel {_takers(known, 'options', name)}", at_key=True))
    for name in sorted({e for c in known.values() for e in c.expects}):
        if exp.get(name) and name not in case.expects:
            out.append(Problem(("expect", name), f"only for kernel {_takers(known, 'expects', name)}", at_key=True))
    return out


def _shape_problems(case: KernelCase, inp: dict, shape: dict) -> list[Problem]:
    need, out = list(case.needed_dims(inp)), []
    for d in need:
        if shape.get(d) is None:
            out.append(Problem(("inputs", "shape"), f"missing required key {d!r} (kernel {case.name} needs {need})"))
    for d, v in shape.items():
        if v is not None and d not in case.dims + case.optional_dims:
            out.append(Problem(("inputs", "shape", d), f"not a dimension of kernel {case.name} (it has {need})",
                               at_key=True))
    return out


def _takers(known: dict, field: str, name: str) -> str:
    return ", ".join(c.name for c in known.values() if name in getattr(c, field))


def elements(kernel: str, s: dict) -> int:
    """About how many elements a run of the kernel allocates at shape `s`, references included."""
    return cases()[kernel].elements(s)


def golden_platform(spec, ctx) -> str:
    return ctx.fixed_platform + "-triton"      # the dtype policy does not apply: inputs name theirs


def describe(spec) -> str:
    inp = spec.inputs
    dims = ", ".join(f"{k}={v}" for k, v in inp["shape"].items() if v is not None)
    return f"kernel {inp['kernel']} [{dims}] {inp['dtype']}"


# --------------------------------------------------------------------------- inputs and calls
def kernel_inputs(spec, device) -> dict:
    """The input tensors of a spec, from the spec's seed: what the target's kernel operation and the
    torch reference are called with (the case's `inputs`; attention: q [T, Hq, D], k and v
    [S, Hkv, D], positions [T], sinks [Hq], window, scale)."""
    inp = spec.inputs
    given = {**inp, "positions": materialize(inp["positions"]) if inp["positions"] is not None else None}
    return cases()[inp["kernel"]].inputs(given, inp["shape"], Draw(inp["seed"], DTYPES[inp["dtype"]], device))


def reference(spec, x: dict) -> torch.Tensor:
    """The op's one torch reference on `kernel_inputs(spec, …)`, in the form the target's output is compared in."""
    return cases()[spec.inputs["kernel"]].reference(x)


def _first(mask: torch.Tensor) -> list[int]:
    return mask.nonzero()[0].tolist()


def run(spec, ctx, target: TargetInterface) -> SpecResult:
    """The target's operation for the spec's kernel (Lockstep's engine: its Triton kernel) against
    the torch reference on the same inputs."""
    own = cases()[spec.inputs["kernel"]]
    case, op = _kernel_op(spec, own, target, str(ctx.device))
    x = kernel_inputs(spec, ctx.device)           # a form takes its kernel's inputs
    offered = {f for f in case.features if target.offers(case.name, f)}
    explain = case.explain and (lambda r, got: case.explain(x, r, got))
    result = _measure(spec, lambda r=slice(None): case.call(op, x, r, offered),
                      functools.cache(lambda: case.reference(x)), None, "", f"{target.name} - reference", explain)
    cause = result.facts.pop("cause", None)       # a form's cause leads, in its judge's words
    result.data["failures"] = [cause] * bool(cause) + [f"{target.name}: {f}" for f in result.data["failures"]]
    if case is not own:                          # the kernel's interface form: its part, bitwise
        result.facts["compared"] = BITWISE
    return result


def _kernel_op(spec, case: KernelCase, t: TargetInterface, device: str) -> tuple[KernelCase, Callable]:
    """(the case run on the target, the target's operation for it): the spec's kernel, or on a
    target without that operation the kernel's interface form (`case.form`: the same inputs
    through an interface operation, judged on part of the output); NotApplicable with the reason."""
    needs = tuple(f for f in case.features if spec.inputs.get(f) is not None) + case.needs
    if case.form is not None and case.name not in t.ops:
        form = case.form
        lead = f"kernel {case.name} is Lockstep's own kernel interface; another target is judged on {form.note}"
        try:
            op = t.op(form.name, device, form.needs)
        except NotApplicable as e:
            raise NotApplicable(f"{lead}: {e}") from None
        if form.rng is not None and getattr(t, "rng", None) != form.rng:
            raise NotApplicable(f"{lead}, bitwise where it declares the RNG model {form.rng!r}: {t.name} declares "
                                f"{getattr(t, 'rng', None)!r} (Target.rng)")
        return form, op
    if case.rng is not None and getattr(t, "rng", None) != case.rng:
        raise NotApplicable(f"kernel {case.name}: {t.name} declares RNG model {getattr(t, 'rng', None)!r}, "
                            f"not {case.rng!r} (Target.rng)")
    why = None if case.interface else f"kernel {case.name}: no target operation is defined for it (Lockstep's own " \
                                      f"kernel interface)"      # an interface operation: the target's own reason
    return case, t.op(case.name, device, needs, why=why)


def _measure(spec, call, reference, rows: int | None, output: str, difference: str, explain=None) -> SpecResult:
    """The spec's expectations of one implementation: `call(rows)` runs it (all rows by default),
    `reference()` gives the reference output; `output` and `difference` name them in failures;
    `rows` None: the output's; `explain(row, got)`: the cause of a bitwise mismatch, leading."""
    exp = spec.expect
    out = call()
    rows = out.shape[0] if rows is None else rows
    where = describe(spec)
    failures: list[str] = []
    cause = None
    if exp.get("finite"):
        bad = ~torch.isfinite(out.to(torch.float64))
        if bad.any():
            failures.append(f"{where}: {int(bad.sum())} non-finite values{output}, first at {_first(bad)}")
    if exp.get("bitwise"):
        ref = reference()
        diff = out.contiguous().view(torch.uint8).reshape(out.shape[0], -1) != \
            ref.contiguous().view(torch.uint8).reshape(ref.shape[0], -1)
        if diff.any():
            bad = sorted(set(diff.any(1).nonzero()[:, 0].tolist()))
            if explain is not None:
                cause = explain(bad[0], out[bad[0]].item())
            failures.append(f"{where}: {output.strip() or 'the output'} differs bitwise from the reference in rows "
                            f"{bad}")
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
    return SpecResult(tensors={"out": out.cpu()}, data={"failures": failures}, facts={"cause": cause} if cause else {})


def applicability(spec, target: TargetInterface, device: str) -> str:
    own = cases()[spec.inputs["kernel"]]
    case, _ = _kernel_op(spec, own, target, device)
    return TOLERANCE if case is own else BITWISE


def compared(spec, ctx, result: SpecResult) -> tuple[str, None]:
    """On a target, the spec's tolerance against the reference is the comparison (a kernel's
    interface form: bitwise against the reference's part): no golden."""
    return result.facts.get("compared", TOLERANCE), None


def check(spec, result: SpecResult) -> list[str]:
    return list(result.data.get("failures", []))
