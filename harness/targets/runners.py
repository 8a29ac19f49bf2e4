"""Running one spec against a target, and how each kind applies (see README, "Targets").

| kind | how it runs on a target | compared |
| --- | --- | --- |
| coins | `hash`, `verify_coins`, `gumbel` on the spec's keys | bitwise with the same golden, and the spec's expectations |
| layer_ids | `eagle3_layers` (resolution + capture order), if the target implements the spec's convention; with `forward`, `capture` on the spec's checkpoint | boundaries exactly; captured states within CROSS_TOL of the golden |
| verify | `verify_greedy` / `verify_target_only` / `verify_rejection` on the spec's tree, rows and coins | bitwise with the same golden, and the hand-worked outcome |
| kernel | the named kernel on the spec's inputs (attention, rmsnorm, sampling) | the spec's tolerance against the plain-torch reference, and its properties (finite, row alone = batch, decode = prefill, reproducible) |
| generate | `greedy_generate` for all-greedy specs with no capture, schedule, draft or topology | tokens exactly, logprobs within CROSS_TOL of the golden |
| distribution | — | n/a: needs a whole speculative engine with seeded draft sampling |

Anything a target cannot run is `n/a` with the reason, never skipped or passed.
"""

from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass, field

import torch

from harness import kinds
from harness.compare import diff_data, diff_tensors
from harness.golden import CorruptGolden, GoldenStore, json_roundtrip
from harness.intseq import materialize
from harness.result import Result, RunContext
from harness.specfile import Spec
from harness.targets.base import NotApplicable, Target, UpstreamChanged

PASS, FAIL, NA = "pass", "fail", "n/a"
BITWISE, TOLERANCE = "bitwise", "tolerance"
# Two implementations of one whole model in fp32 sum in different orders: |a - b| <= ATOL + RTOL |b|
# (tests/engine/test_hf_agreement.py: max ~5e-6 on logits of size ~5 for 2 blocks).
# Measured on the 2-block tiny preset; over the 24 and 36 blocks of tiny-d24 / tiny-d36 the same
# rounding reaches 5e-4 (HF, layer_ids forward specs), so whole-model comparisons use 1e-3: a real
# convention error (window off by one, sink scaled, RoPE interleaved, router softmax) moves 1e-2 or more.
CROSS_ATOL = CROSS_RTOL = 1e-3


@dataclass
class TargetOutcome:
    spec: Spec
    target: str
    status: str                      # pass | fail | n/a
    compare: str = ""                # bitwise | tolerance
    message: str = ""                # the first mismatch (fail) or the reason (n/a)
    messages: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {"id": self.spec.id, "kind": self.spec.kind, "target": self.target, "status": self.status,
                "compare": self.compare, "message": self.message, "messages": list(self.messages),
                "seconds": round(self.seconds, 3)}


# --------------------------------------------------------------------------- coins
def _coins(spec, ctx, t: Target):
    inp = spec.inputs
    wanted, dev = inp["outputs"], str(ctx.device)
    ops = {name: t.op(name, dev) for name, need in (("hash", "hash"), ("verify_coins", "coins"),
                                                    ("gumbel", "gumbel")) if need in wanted}

    def compute():
        out = {}
        if inp["keys"] is not None:
            keys = torch.tensor(inp["keys"], dtype=torch.int64)
            s, p, c = keys[:, 0].contiguous(), keys[:, 1].contiguous(), keys[:, 2].contiguous()
            if "hash" in wanted or "coins" in wanted:
                h = torch.stack([ops["hash"](s[i:i + 1], p[i:i + 1], c[i:i + 1])[0, 0] for i in range(len(s))]) \
                    if "hash" in ops else None
                if "hash" in wanted:
                    out["hash"] = h
            if "coins" in wanted:
                # keys mode: the coin of each key is column `col` of verify coins at (seed, pos)
                vc = [ops["verify_coins"](s[i:i + 1], p[i:i + 1], int(c[i]) + 1) for i in range(len(s))]
                out["coins"] = torch.stack([torch.cat([cs[0], f])[int(c[i])] for i, (cs, f) in enumerate(vc)])
            if "gumbel" in wanted:
                out["gumbel"] = torch.stack([ops["gumbel"](s[i:i + 1], p[i:i + 1], c[i:i + 1])[0, 0]
                                             for i in range(len(s))])
            return out
        seeds, pos = kinds.coins._rows(inp, torch.device("cpu"))
        if inp["columns"] is not None:
            cols = materialize(inp["columns"])
            if "hash" in wanted:
                out["hash"] = ops["hash"](seeds, pos, cols).to(torch.int64)
            if "gumbel" in wanted:
                out["gumbel"] = ops["gumbel"](seeds, pos, cols).to(torch.float64)
        if "coins" in wanted:
            coins, final = ops["verify_coins"](seeds, pos, inp["draft_token_num"])
            out["coins"], out["final"] = coins.contiguous(), final.contiguous()
        return {k: v.cpu() for k, v in out.items()}

    if inp["keys"] is not None and "coins" in wanted and "verify_coins" in ops:
        # a keys-mode coin is the coin of one hash; verify_coins gives it as column col of row (seed, pos)
        if any(k[2] < 0 or k[2] > 4096 for k in inp["keys"]):
            raise NotApplicable("keys-mode coins with columns outside 0 … 4096 need the coin of one hash, "
                                "which this target only exposes through verify_coins")
    tensors = compute()
    data = {}
    if spec.expect.get("reproducible"):
        again = compute()
        data["second_run_identical"] = all(again[k].view(torch.uint8).equal(v.view(torch.uint8))
                                           for k, v in tensors.items())
    return Result(tensors=tensors, data=data), BITWISE, kinds.coins.golden_platform(spec, ctx)


# --------------------------------------------------------------------------- layer_ids
def _layer_ids(spec, ctx, t: Target):
    from engine.boundaries import LayerIdError
    from engine.config import preset

    inp = spec.inputs
    if "eagle3_layers" not in t.ops and inp["forward"] and "capture" in t.ops:
        return _capture_only(spec, ctx, t)
    if inp["convention"] not in t.conventions:
        raise NotApplicable(f"{t.name} reads layer ids under the {'/'.join(t.conventions) or 'no'} convention, "
                            f"not {inp['convention']!r}" if t.conventions else
                            f"{t.name} has no EAGLE3 layer-id resolution")
    resolve = t.op("eagle3_layers", str(ctx.device))
    capture = t.op("capture", str(ctx.device)) if inp["forward"] else None
    cfg = preset(inp["target"])
    draft_config = inp["draft_config"] if inp["draft_config"] is not None else (
        {"eagle_aux_hidden_state_layer_ids": inp["ids"]} if inp["ids"] is not None else {})
    fc_in = inp["draft_fc_in"] or 3 * cfg.hidden_size
    name = inp["config_name"] or spec.id
    try:
        boundaries = [int(b) for b in resolve(draft_config, inp["convention"], cfg.num_hidden_layers,
                                              fc_in, cfg.hidden_size, name, direct_ids=inp["ids"] is not None)]
    except (LayerIdError, ValueError, AssertionError) as e:
        return Result(data={"error": type(e).__name__, "message": str(e)}), BITWISE, None
    data = {"boundaries": boundaries, "aux_width": len(boundaries) * cfg.hidden_size}
    if not inp["forward"]:
        return Result(data=data), BITWISE, None
    from harness.checkpoints import checkpoint_dir

    ckpt = checkpoint_dir(inp["target"], inp["forward"]["seed"], "bf16")
    got = capture(ckpt, materialize(inp["forward"]["prompt"]).tolist(), boundaries)
    data["captured_width"] = data["expected_width"] = len(boundaries) * cfg.hidden_size
    data["captured_width"] = int(got.shape[-1])
    data["chunks_differing_from_walk"] = []
    return Result(tensors={"captured": got}, data=data), TOLERANCE, kinds.layer_ids.golden_platform(spec, ctx)


def _capture_only(spec, ctx, t: Target):
    """A target without EAGLE3 resolution (HF): capture the spec's own boundaries on its forward."""
    from engine.config import preset
    from harness.checkpoints import checkpoint_dir

    inp = spec.inputs
    boundaries = spec.expect["boundaries"]
    H = preset(inp["target"]).hidden_size
    ckpt = checkpoint_dir(inp["target"], inp["forward"]["seed"], "bf16")
    got = t.op("capture", str(ctx.device))(ckpt, materialize(inp["forward"]["prompt"]).tolist(), boundaries)
    data = {"boundaries": boundaries, "aux_width": len(boundaries) * H, "captured_width": int(got.shape[-1]),
            "expected_width": len(boundaries) * H, "chunks_differing_from_walk": []}
    return Result(tensors={"captured": got}, data=data), TOLERANCE, kinds.layer_ids.golden_platform(spec, ctx)


# --------------------------------------------------------------------------- verify
def _verify(spec, ctx, t: Target):
    from harness.kinds import verify as V

    inp = spec.inputs
    mode = inp["mode"]
    fn = t.op({"greedy": "verify_greedy", "target-only": "verify_target_only", "rejection": "verify_rejection"}[mode],
              str(ctx.device))
    tree = V._tree(spec)
    n = len(tree.parents)
    tensors = {}
    if mode == "greedy":
        rows = V._per_node(inp["probs"] if inp["probs"] is not None else inp["logits"], n)
        accepted, nxt = fn(tree, [int(torch.argmax(row)) for row in rows])
    else:
        p = V._target(spec, n)
        coins, final = V._coins(spec, n)
        tensors["coins"] = torch.cat([coins, torch.tensor([final], dtype=torch.float32)])
        if mode == "target-only":
            th = inp["thresholds"] or {"single": 1.0, "acc": 1.0}
            accepted, nxt = fn(tree, p, coins, final, th["single"], th["acc"])
        else:
            tree.q = [None] + list(V._per_node(inp["q"], n - 1))
            accepted, nxt = fn(tree, p, coins, final)
    return V.verify_result(tree, accepted, nxt, tensors), BITWISE, V.golden_platform(spec, ctx)


# --------------------------------------------------------------------------- kernel
KERNEL_OPS = {"attention": "attention", "rmsnorm": "rmsnorm", "sampling": "sampling"}


def _kernel(spec, ctx, t: Target):
    from harness.kinds import kernel as K

    inp, exp = spec.inputs, spec.expect
    name = inp["kernel"]
    if name not in KERNEL_OPS:
        raise NotApplicable(t.missing.get(name, f"kernel {name}: no target operation is defined for it "
                                                f"(Lockstep's own kernel interface)"))
    op = t.op(KERNEL_OPS[name], str(ctx.device))
    x = K.kernel_inputs(spec, ctx.device)
    if name == "attention":
        call = lambda r=slice(None): op(x["q"][r], x["k"], x["v"], x["positions"][r], x["sinks"], x["window"],
                                        x["scale"])
        ref = K.reference(spec, x)
    elif name == "rmsnorm":
        call = lambda r=slice(None): op(x["x"][r], x["weight"], 1e-5)
        ref = K.reference(spec, x)
    else:
        call = lambda r=slice(None): op(x["logp"][r], x["seeds"][r], x["positions"][r])
        ref = K.reference(spec, x)
    out = call()
    rows = out.shape[0]
    where = f"{t.name}: {K.describe(spec)}"
    fails = []
    if exp.get("finite"):
        bad = ~torch.isfinite(out.to(torch.float64))
        if bad.any():
            fails.append(f"{where}: {int(bad.sum())} non-finite values, first at {bad.nonzero()[0].tolist()}")
    if exp.get("tolerance") is not None:
        if out.shape != ref.shape:
            fails.append(f"{where}: output shape {list(out.shape)}, the reference has {list(ref.shape)}")
        else:
            err = (out.to(torch.float64) - ref.to(torch.float64)).abs().nan_to_num(nan=math.inf)
            if err.numel() and float(err.max()) > exp["tolerance"]:
                fails.append(f"{where}: max |{t.name} - reference| = {float(err.max()):.3g} at "
                             f"{(err == err.max()).nonzero()[0].tolist()}, above the tolerance {exp['tolerance']:.3g}")
    for key, what in (("batch_invariant", "row alone"), ("prefill_decode", "decode step (query alone)")):
        if exp.get(key):
            for r in sorted({0, rows // 2, rows - 1}):
                one = call(slice(r, r + 1))
                if not one.contiguous().view(torch.uint8).equal(out[r:r + 1].contiguous().view(torch.uint8)):
                    fails.append(f"{where}: {what} differs bitwise from row {r} of the batch of {rows}")
                    break
    if exp.get("reproducible"):
        if not call().contiguous().view(torch.uint8).equal(out.contiguous().view(torch.uint8)):
            fails.append(f"{where}: a second run gave different bits")
    return Result(tensors={"out": out.cpu()}, data={"failures": fails}), TOLERANCE, None


# --------------------------------------------------------------------------- generate
def _generate(spec, ctx, t: Target):
    from harness.checkpoints import target_dir
    from harness.kinds.generate import project_root

    inp = spec.inputs
    for key in ("capture", "draft", "speculative", "topologies", "schedule"):
        if inp.get(key):
            raise NotApplicable(f"{t.name}: generate specs with {key!r} need the engine's own scheduler; "
                                f"only plain greedy generation is an operation of a target")
    if not all(_greedy(r) for r in inp["requests"]):
        raise NotApplicable("seeded sampling runs through the engine's own sampler; only all-greedy generate "
                            "specs are an operation of a target")
    op = t.op("greedy_generate", str(ctx.device))
    ckpt = target_dir(inp["checkpoint"], project_root(spec))
    tensors, data = {}, {"tokens": [], "finish_reasons": []}
    for i, r in enumerate(inp["requests"]):
        s = r["sampling"]
        tokens, logprobs, reason = op(ckpt, materialize(r["prompt"]).tolist(), s["max_new_tokens"],
                                      s["stop_token_ids"])
        tensors[f"tokens_{i}"] = torch.tensor(tokens, dtype=torch.int64)
        tensors[f"logprobs_{i}"] = logprobs.to(torch.float32)
        data["tokens"].append(list(tokens))
        data["finish_reasons"].append(reason)
    return Result(tensors=tensors, data=data, facts={"variants_differing": {}}), TOLERANCE, \
        kinds.generate.golden_platform(spec, ctx)


def _greedy(request) -> bool:
    from harness.kinds.generate import _params
    return _params(request["sampling"]).is_greedy and request["seed"] is None


def _not_applicable(why):
    def run(spec, ctx, t):
        raise NotApplicable(why)
    return run


KIND_RUNNERS = {
    "coins": _coins, "layer_ids": _layer_ids, "verify": _verify, "kernel": _kernel, "generate": _generate,
    "distribution": _not_applicable("the output law of speculative sampling needs a whole speculative engine "
                                    "with seeded draft sampling, not an operation of a target"),
}


# --------------------------------------------------------------------------- comparison
def _tolerance_diff(golden: dict, got: dict) -> list[str]:
    out = []
    for name in sorted(set(golden) | set(got)):
        if name not in got or name not in golden:
            out.append(f"tensor {name!r} is {'missing' if name not in got else 'not in the golden'}")
            continue
        g, x = golden[name], got[name]
        if g.shape != x.shape:
            out.append(f"tensor {name!r}: shape {list(x.shape)}, the golden has {list(g.shape)}")
            continue
        if not g.is_floating_point():
            if not torch.equal(g, x.to(g.dtype)):
                i = (g != x.to(g.dtype)).nonzero()[0].tolist()
                out.append(f"tensor {name!r} differs at {i}: {x[tuple(i)].item()} instead of {g[tuple(i)].item()}")
            continue
        g64, x64 = g.to(torch.float64), x.to(torch.float64)
        err = (x64 - g64).abs().nan_to_num(nan=math.inf)
        bound = CROSS_ATOL + CROSS_RTOL * g64.abs()
        bad = err > bound
        if bad.any():
            i = bad.nonzero()[0].tolist()
            out.append(f"tensor {name!r}: {int(bad.sum())} of {g.numel()} values outside |d| <= "
                       f"{CROSS_ATOL:g} + {CROSS_RTOL:g}|golden|, first at {i}: {x64[tuple(i)].item():.9g} instead "
                       f"of {g64[tuple(i)].item():.9g} (max |d| {float(err.max()):.3g})")
    return out


def run_on_target(spec: Spec, ctx: RunContext, target: Target, store: GoldenStore) -> TargetOutcome:
    start = time.perf_counter()
    out = TargetOutcome(spec, target.label, PASS)
    runner = KIND_RUNNERS.get(spec.kind)
    try:
        if runner is None:
            raise NotApplicable(f"kind {spec.kind!r} has no target runner")
        with torch.inference_mode():
            result, out.compare, platform = runner(spec, ctx, target)
        result.data = json_roundtrip(result.data)
        fails = list(kinds.KINDS[spec.kind].check(spec, result))
        if platform is not None:
            try:
                golden = store.load(platform, spec.id)
            except CorruptGolden as e:
                golden, fails = None, fails + [f"corrupt golden: {e}"]
            if golden is None:
                fails.append(f"no golden on {platform} to compare with (record it with lockstep regen {spec.id})")
            elif out.compare == BITWISE:
                fails += [d.describe() for d in diff_tensors(golden.tensors, result.tensors)]
                dd = diff_data(golden.data, result.data)
                if dd:
                    fails.append(f"data differs from the golden: {dd}")
            else:
                fails += _tolerance_diff(golden.tensors, result.tensors)
        if fails:
            out.status, out.messages = FAIL, fails
    except NotApplicable as e:
        out.status, out.message = NA, str(e)
    except UpstreamChanged as e:
        out.status, out.messages = FAIL, [f"adapter refused: {e}"]
    except Exception as e:                  # the implementation under test crashed
        tb = traceback.format_exception(type(e), e, e.__traceback__, limit=-3)
        out.status, out.messages = FAIL, [f"crash: {type(e).__name__}: {e}".splitlines()[0], "".join(tb).rstrip()]
    if out.status == FAIL:
        out.message = out.messages[0].splitlines()[0][:300]
    out.seconds = time.perf_counter() - start
    return out


def applicability(spec: Spec, t: Target, device: str = "cpu") -> tuple[str, str]:
    """(how it compares, or 'n/a'; the reason) without running the spec."""
    inp = spec.inputs
    try:
        if spec.kind == "coins":
            for out, op in (("hash", "hash"), ("coins", "verify_coins"), ("gumbel", "gumbel")):
                if out in inp["outputs"]:
                    t.op(op, device)
            return BITWISE, ""
        if spec.kind == "layer_ids":
            if "eagle3_layers" not in t.ops and inp["forward"] and "capture" in t.ops:
                return TOLERANCE, ""
            if inp["convention"] not in t.conventions:
                raise NotApplicable(f"convention {inp['convention']!r} is not {t.name}'s")
            t.op("eagle3_layers", device)
            if inp["forward"]:
                t.op("capture", device)
                return TOLERANCE, ""
            return BITWISE, ""
        if spec.kind == "verify":
            t.op({"greedy": "verify_greedy", "target-only": "verify_target_only",
                  "rejection": "verify_rejection"}[inp["mode"]], device)
            return BITWISE, ""
        if spec.kind == "kernel":
            if inp["kernel"] not in KERNEL_OPS:
                raise NotApplicable(t.missing.get(inp["kernel"], f"no target operation for kernel {inp['kernel']}"))
            t.op(KERNEL_OPS[inp["kernel"]], device)
            return TOLERANCE, ""
        if spec.kind == "generate":
            for key in ("capture", "draft", "speculative", "topologies", "schedule"):
                if inp.get(key):
                    raise NotApplicable(f"uses {key!r}")
            if not all(_greedy(r) for r in inp["requests"]):
                raise NotApplicable("seeded sampling")
            t.op("greedy_generate", device)
            return TOLERANCE, ""
        raise NotApplicable(f"kind {spec.kind}")
    except NotApplicable as e:
        return NA, str(e)
