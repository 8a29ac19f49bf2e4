"""Spec kind `mxfp4`: MXFP4 decoding against answers written by hand from DESIGN §7.

    kind: mxfp4
    description: …
    inputs:                         # decode mode: blocks → values
      blocks:                       # the blocks of one weight, in order; each 16 bytes + its scale
        - {bytes: [0xF0, 0xE1, 0xD2, 0xC3, 0xB4, 0xA5, 0x96, 0x87,
                   0x78, 0x69, 0x5A, 0x4B, 0x3C, 0x2D, 0x1E, 0x0F], scale: 127}
      rows: 1                       # the weight's rows: blocks [rows, G / rows, 16] (default 1)
      dtype: fp32                   # fp32 | bf16: what engine.mxfp4.dequantize returns
    expect:
      values:                       # per block, its 32 values: numbers, .nan / .inf / -.inf,
        - [0, -6, 0.5, -4, …]       # -0.0, or C99 hex floats ("0x1.8p-126") for exact powers of two

    inputs:                         # checkpoint mode: a synthetic MXFP4 checkpoint with scales set
      checkpoint: {preset: tiny, seed: 0}
      set_scales: [{tensor: model.layers.1.mlp.experts.down_proj_scales, index: [3, 17, 1], value: 255}]
    expect:
      error: ["model.layers.1.mlp.experts.down_proj_scales", "[3, 17, 1]", "255"]   # or loads: true

Decode mode calls the target's `mxfp4_decode` on the spec's bytes (on Lockstep's engine
`engine.mxfp4.dequantize` on the run's device; on the triton backend
`kernels.matmul.mxfp4_decode_triton`, the decode the matmul and grouped-expert kernels do in their
tile loads, golden in `<device>-fp32-triton`: its bf16 NaN is 0x7FC0, torch's 0xFFFF) and compares
each value with the hand-written one bitwise in the output dtype (so -0.0 is not 0.0); an expected
NaN accepts any NaN. A failure names the block, its scale, the element, the byte and nibble it came
from, the code, the decoded value and the expected one. The expectations never come from the code
under test, so a bug that the packer (`quantize`) and the decoder share is still seen.

Checkpoint mode writes an edited copy of the checkpoint (harness.checkpoints.edited_copy) and loads
it with the target's `load_checkpoint` (Lockstep's: `engine.checkpoint.load_checkpoint`): the load
must fail naming each of the `error` substrings, or (`loads: true`) succeed.

The golden (`shared`: decoding is exact) holds the decoded `values` [rows, G / rows * 32], or the
load outcome as data.
"""

from __future__ import annotations

import math

import torch

from lockstep.engine.checkpoint import expected_tensors
from lockstep.engine.config import preset
from lockstep.harness.checkpoints import checkpoint_dir, edited_copy
from lockstep.harness.platform import SHARED
from lockstep.harness.result import SpecResult
from lockstep.harness.schema import Bool, Field, Int, List, Map, Problem, Schema, Str
from lockstep.harness.target import BITWISE, Refused, TargetInterface

NAME = "mxfp4"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
_INT = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


class Value(Schema):
    """A float written by hand: a YAML number (.nan, .inf, -.inf, -0.0 included) or a C99 hex float."""
    expected = "a number, .nan, .inf, -.inf or a hex float such as '0x1.8p-126'"

    def check(self, value, path, problems):
        if isinstance(value, bool):
            return self._wrong(value, path, problems)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float.fromhex(value)
            except ValueError:
                pass
        return self._wrong(value, path, problems)


BLOCK = Map({
    "bytes": Field(List(Int(min=0, max=255), min_len=16, max_len=16), required=True,
                   doc="16 bytes: byte b holds element 2b in its low nibble, 2b + 1 in its high nibble"),
    "scale": Field(Int(min=0, max=255), required=True, doc="the E8M0 scale"),
})
SET_SCALE = Map({
    "tensor": Field(Str(), required=True, doc="an MXFP4 *_scales tensor of the checkpoint"),
    "index": Field(List(Int(min=0), min_len=1), required=True),
    "value": Field(Int(min=0, max=255), required=True),
})
INPUTS = Map({
    "blocks": Field(List(BLOCK, min_len=1)),
    "rows": Field(Int(min=1), default=1),
    "dtype": Field(Str(choices=DTYPES), default="fp32"),
    "checkpoint": Field(Map({
        "preset": Field(Str(), required=True),
        "seed": Field(Int(min=0, max=2**63 - 1), default=0),
    })),
    "set_scales": Field(List(SET_SCALE, min_len=1)),
})
EXPECT = Map({
    "values": Field(List(List(Value(), min_len=32, max_len=32), min_len=1),
                    doc="per block, its 32 decoded values"),
    "error": Field(List(Str(), min_len=1), doc="substrings the checkpoint load error must contain"),
    "loads": Field(Bool(), doc="the edited checkpoint must load"),
})


def _scales_shapes(preset_name: str) -> dict[str, tuple[int, ...]]:
    cfg = preset(preset_name)
    return {n: shape for n, (shape, _) in expected_tensors(cfg, mxfp4_experts=True).items() if n.endswith("_scales")}


def validate(doc: dict, root=None) -> list[Problem]:
    inp, exp, out = doc["inputs"], doc["expect"] or {}, []
    decode, ckpt = inp["blocks"] is not None, inp["checkpoint"] is not None
    if decode == ckpt:
        return [Problem(("inputs",), "give either 'blocks' (decode) or 'checkpoint' with 'set_scales', not both")]
    if decode:
        for key in ("set_scales",):
            if inp[key] is not None:
                out.append(Problem(("inputs", key), "only with 'checkpoint'", at_key=True))
        n = len(inp["blocks"])
        if n % inp["rows"]:
            out.append(Problem(("inputs", "rows"), f"{n} blocks cannot be cut into {inp['rows']} rows"))
        if exp.get("values") is None or exp.get("error") is not None or exp.get("loads") is not None:
            out.append(Problem(("expect",), "a decode spec expects 'values' (and neither 'error' nor 'loads')"))
        elif len(exp["values"]) != n:
            out.append(Problem(("expect", "values"), f"expected {n} lists, one per block, found {len(exp['values'])}"))
        else:
            dt = DTYPES[inp["dtype"]]
            for b, row in enumerate(exp["values"]):
                for e, v in enumerate(row):
                    if not math.isnan(v) and float(torch.tensor(v, dtype=torch.float64).to(dt)) != v:
                        out.append(Problem(("expect", "values", b, e), f"{v!r} is not exactly representable in "
                                                                       f"{inp['dtype']}"))
        return out
    if inp["set_scales"] is None:
        out.append(Problem(("inputs",), "a checkpoint spec needs 'set_scales'"))
    if inp["dtype"] != "fp32" or inp["rows"] != 1:
        out.append(Problem(("inputs",), "'rows' and 'dtype' are for decode specs"))
    if (exp.get("error") is None) == (exp.get("loads") is None) or exp.get("values") is not None:
        out.append(Problem(("expect",), "a checkpoint spec expects either 'error' or 'loads: true'"))
    try:
        shapes = _scales_shapes(inp["checkpoint"]["preset"])
    except ValueError as e:
        return out + [Problem(("inputs", "checkpoint", "preset"), str(e))]
    for i, s in enumerate(inp["set_scales"] or []):
        shape = shapes.get(s["tensor"])
        if shape is None:
            out.append(Problem(("inputs", "set_scales", i, "tensor"), f"not an MXFP4 scales tensor of preset "
                                                                      f"{inp['checkpoint']['preset']} (e.g. "
                                                                      f"{next(iter(shapes))})"))
        elif len(s["index"]) != len(shape) or any(x >= d for x, d in zip(s["index"], shape)):
            out.append(Problem(("inputs", "set_scales", i, "index"), f"not an index of {s['tensor']}, shape "
                                                                     f"{list(shape)}"))
    return out


def golden_platform(spec, ctx) -> str:
    if spec.inputs["blocks"] is not None and ctx.backend == "triton":
        return ctx.fixed_platform + "-triton"   # the kernels' decode: a bf16 NaN keeps the fp32 NaN's upper half
    return SHARED


# --------------------------------------------------------------------------- decode mode
def _describe_element(b: int, e: int, block: dict) -> str:
    byte = block["bytes"][e // 2]
    nibble = "high" if e % 2 else "low"
    code = (byte >> 4) if e % 2 else (byte & 0x0F)
    return (f"block {b} (scale {block['scale']}), element {e}: byte {e // 2} = 0x{byte:02X}, {nibble} nibble, "
            f"code 0x{code:X}")


def _same(got: torch.Tensor, want: float, dt: torch.dtype) -> bool:
    if math.isnan(want):
        return bool(torch.isnan(got))
    w = torch.tensor(want, dtype=torch.float64).to(dt)
    return bool(got.reshape(1).view(_INT[dt]) == w.reshape(1).view(_INT[dt]))


def _decode(spec, ctx, t: TargetInterface) -> SpecResult:
    """Each decoded value against the hand-written one, decoded by the target's `mxfp4_decode`
    (on Lockstep's engine, the run's backend's: Triton's is the decode the matmul and grouped-expert
    kernels do in their tile loads)."""
    inp = spec.inputs
    dt = DTYPES[inp["dtype"]]
    n, rows = len(inp["blocks"]), inp["rows"]
    blocks = torch.tensor([b["bytes"] for b in inp["blocks"]], dtype=torch.uint8).reshape(rows, n // rows, 16)
    scales = torch.tensor([b["scale"] for b in inp["blocks"]], dtype=torch.uint8).reshape(rows, n // rows)
    name = f"{t.name}: mxfp4_decode"
    out = torch.as_tensor(t.op("mxfp4_decode", str(ctx.device))(blocks, scales, dt)).cpu()   # [rows, G / rows * 32]
    failures = []
    if tuple(out.shape) != (rows, n // rows * 32) or out.dtype != dt:
        failures.append(f"{name} returned {out.dtype} {list(out.shape)}, expected {dt} [{rows}, {n // rows * 32}]")
    else:
        flat = out.reshape(n, 32)
        for b, want_row in enumerate(spec.expect["values"]):
            for e, want in enumerate(want_row):
                if not _same(flat[b, e], want, dt):
                    failures.append(f"{_describe_element(b, e, inp['blocks'][b])}: decoded "
                                    f"{float(flat[b, e])!r}, DESIGN §7 gives {want!r}")
    return SpecResult(tensors={"values": out}, facts={"failures": failures})


# --------------------------------------------------------------------------- checkpoint mode
def edited_checkpoint(spec):
    """The spec's MXFP4 preset checkpoint with its `set_scales` edits written in (a cached copy);
    the folder a loader is asked to load (the kind's own loader, or a target's)."""

    inp = spec.inputs
    ck = inp["checkpoint"]
    edits: dict[str, list[dict]] = {}
    for s in inp["set_scales"]:
        edits.setdefault(s["tensor"], []).append(s)

    def edit(name, t):
        if name not in edits:
            return None
        t = t.clone()
        for s in edits[name]:
            t[tuple(s["index"])] = s["value"]
        return t

    return edited_copy(checkpoint_dir(ck["preset"], ck["seed"], "mxfp4"), f"mxfp4-{spec.id.replace('/', '_')}", edit)


def _load(spec, ctx, t: TargetInterface) -> SpecResult:
    """The target's `load_checkpoint`; a clean refusal (harness/target.py, "Refusals") is
    recorded with its message, any other exception is a crash."""
    load, refusals = t.op("load_checkpoint", str(ctx.device)), (Refused, ValueError, *t.refusals)
    path = edited_checkpoint(spec)
    try:
        load(path)
    except refusals as e:
        return SpecResult(data={"loaded": False, "error": str(e).replace(str(path), "<checkpoint>")})
    return SpecResult(data={"loaded": True})


def run(spec, ctx, target: TargetInterface) -> SpecResult:
    return (_decode if spec.inputs["blocks"] is not None else _load)(spec, ctx, target)


def applicability(spec, target: TargetInterface, device: str) -> str:
    target.op("mxfp4_decode" if spec.inputs["blocks"] is not None else "load_checkpoint", device)
    return BITWISE


def compared(spec, ctx, result: SpecResult) -> tuple[str, str | None]:
    """Decoded values bitwise against the golden; a load (or its refusal) has none."""
    return BITWISE, golden_platform(spec, ctx) if spec.inputs["blocks"] is not None else None


def refusal(result: SpecResult) -> str | None:
    return result.data["error"] if result.data.get("loaded") is False else None


def check(spec, result: SpecResult) -> list[str]:
    exp, data = spec.expect, result.data
    if spec.inputs["blocks"] is not None:
        fails = list(result.facts["failures"])
        if len(fails) > 12:
            fails = fails[:12] + [f"… and {len(fails) - 12} more values differ"]
        return fails
    if exp.get("loads"):
        return [] if data["loaded"] else [f"the checkpoint was refused: {data['error']}"]
    if data["loaded"]:
        return [f"the checkpoint loaded; the spec expects it refused, naming {exp['error']}"]
    missing = [s for s in exp["error"] if s not in data["error"]]
    return [f"the load error does not mention {missing}: {data['error']}"] if missing else []
