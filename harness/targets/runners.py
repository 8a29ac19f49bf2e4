"""Running one spec against a target, and how each kind applies (see README, "Targets").

| kind | how it runs on a target | compared |
| --- | --- | --- |
| coins | `hash`, `verify_coins`, `gumbel` on the spec's keys | bitwise with the same golden, and the spec's expectations |
| layer_ids | `eagle3_layers` (resolution + capture order), if the target implements the spec's convention; with `forward`, `capture` on the spec's checkpoint | boundaries exactly; captured states within CROSS_TOL of the golden |
| verify | `verify_greedy` / `verify_target_only` / `verify_rejection` on the spec's tree, rows and coins | bitwise with the same golden, and the hand-worked outcome |
| kernel | the named kernel on the spec's inputs (attention, rmsnorm, sampling) | the spec's tolerance against the plain-torch reference, and its properties (finite, row alone = batch, decode = prefill, reproducible) |
| generate | `generate` (features: sampling, batch, capture, prefill_chunk), or `greedy_generate` one request at a time for greedy specs without capture or chunking; with a draft `speculative_generate`; the spec's variants re-run through the same operation; topologies n/a | tokens and accept lengths exactly, logprobs and captured states within CROSS_TOL of the golden; the variants bitwise against the target's own run |
| draft | `draft_stages` on the aux rows of Lockstep's own target forward | every stage within CROSS_TOL, and the kind's independent checks |
| mxfp4 | `mxfp4_decode` on the spec's bytes; checkpoint mode: `load_checkpoint` of the edited checkpoint | values bitwise (hand-written and the golden); a refusal by its facts (tensor, index, scale) |
| distribution | `speculative_generate` (features: sampling, batch, the verify mode, tree) on one request per seed | the kind's chi-square test of the target's tokens against the exact law of Lockstep's forward, and its acceptance bounds (no golden) |
| prefix-cache | `prefix_cache` (the optional capability; features: sampling, prefill_chunk): cold = a fresh cache's run, warm = after the case's warm-up prompts through one cache | warm against cold bitwise within the target, the reused positions and hit count exactly (the kind's check); the cold runs within CROSS_TOL of the golden |

Anything a target cannot run is `n/a` with the reason, never skipped or passed.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field

import torch

from harness import kinds
from harness.compare import diff_data, diff_tensors
from harness.errors import full_traceback, where
from harness.golden import CorruptGolden, GoldenStore, json_roundtrip
from harness.intseq import materialize
from harness.result import Result, RunContext
from harness.specfile import Spec
from harness.targets.base import NotApplicable, Refused, Target, UpstreamChanged
from engine.request import Request, Result as Generation

PASS, FAIL, NA = "pass", "fail", "n/a"
BITWISE, TOLERANCE, CHI_SQUARE = "bitwise", "tolerance", "chi-square"
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
    traceback: str = ""              # of a crash: shown with --debug (and in pytest's report)

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
    except (Refused, LayerIdError, ValueError, AssertionError, *t.refusals) as e:
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
def _gen_requests(spec) -> list[Request]:
    from harness.kinds.generate import _requests

    return _requests(spec)


def _plain_call(spec, t: Target, device: str, sampled: bool):
    """call(requests, prefill_chunk) -> [Generation] through `generate`, or `greedy_generate` for
    what the minimal loop can run (greedy, no capture, no chunking); NotApplicable otherwise."""
    inp, exp = spec.inputs, spec.expect
    chunked = (inp["schedule"] or {}).get("prefill_chunk") is not None or bool(exp.get("prefill_chunks"))
    needs = tuple(n for n, on in (("sampling", sampled), ("capture", bool(inp["capture"])),
                                  ("prefill_chunk", chunked),
                                  ("batch", bool(exp.get("batch_invariant")) and len(inp["requests"]) > 1)) if on)
    if "generate" not in t.ops and "greedy_generate" in t.ops and not needs:
        greedy = t.op("greedy_generate", device)

        def call(requests, ckpt, prefill_chunk=None):
            return [Generation(*greedy(ckpt, r.prompt, r.params.max_new_tokens, r.params.stop_token_ids))
                    for r in requests]
        return call
    op = t.ops.get("generate")
    gen = t.op("generate", device, needs)
    batched = "batch" in op.features
    capture = tuple(inp["capture"] or ())
    max_batch = (inp["schedule"] or {}).get("max_batch") or 8

    def call(requests, ckpt, prefill_chunk=None):
        kw = {"capture": capture} if capture else {}
        if prefill_chunk is not None:
            kw["prefill_chunk"] = prefill_chunk
        if batched:
            return list(gen(ckpt, requests, max_batch=max_batch, **kw))
        return [out for r in requests for out in gen(ckpt, [r], max_batch=1, **kw)]
    return call


def _speculative_call(spec, t: Target, device: str, sampled: bool):
    inp, exp = spec.inputs, spec.expect
    sp = inp["speculative"]
    mode = sp["verify"] if sampled else "greedy"     # greedy requests are verified greedily (DESIGN §6)
    needs = (mode,) + (("tree",) if sp["topk"] > 1 else ()) + (("sampling",) if sampled else ()) + \
        (("batch",) if exp.get("batch_invariant") and len(inp["requests"]) > 1 else ())
    op = t.op("speculative_generate", device, needs)
    batched = "batch" in t.ops["speculative_generate"].features

    def call(requests, ckpt, draft, prefill_chunk=None):
        args = (ckpt, draft, inp["draft"]["convention"])
        if batched:
            return list(op(*args, requests, dict(sp)))
        return [out for r in requests for out in op(*args, [r], dict(sp))]
    return call


def _generate_plan(spec, t: Target, device: str):
    """(the spec's own call, the plain call for equals_plain or None); NotApplicable with the reason."""
    inp, exp = spec.inputs, spec.expect
    if inp.get("topologies"):
        raise NotApplicable(f"{t.name}: generate specs with 'topologies' split Lockstep's own engine over "
                            f"torch.distributed; a topology is not an operation of a target")
    sampled = any(not r.params.is_greedy for r in _gen_requests(spec))
    if inp["draft"] is not None:
        plain = _plain_call(spec, t, device, sampled) if exp.get("equals_plain") else None
        return _speculative_call(spec, t, device, sampled), plain
    return _plain_call(spec, t, device, sampled), None


def _bits(o: Generation) -> tuple:
    """What must be bit-identical between two runs of one implementation (as in the generate kind)."""
    def raw(x):
        return None if x is None else x.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    return (tuple(o.tokens), raw(torch.as_tensor(o.logprobs, dtype=torch.float32)), raw(o.captured),
            None if o.accept_lengths is None else tuple(o.accept_lengths))


def _generate(spec, ctx, t: Target):
    from harness.checkpoints import draft_dir, target_dir
    from harness.kinds.generate import _same, project_root

    inp, exp = spec.inputs, spec.expect
    own, plain = _generate_plan(spec, t, str(ctx.device))
    root = project_root(spec)
    ckpt = target_dir(inp["checkpoint"], root)
    requests = _gen_requests(spec)
    if inp["draft"] is not None:
        ddir = draft_dir(inp["draft"], inp["checkpoint"], root)
        run = lambda reqs, chunk=None: own(reqs, ckpt, ddir)                       # noqa: E731
    else:
        chunk0 = (inp["schedule"] or {}).get("prefill_chunk")
        run = lambda reqs, chunk=None: own(reqs, ckpt, chunk if chunk is not None else chunk0)  # noqa: E731
    results = run(requests)
    if len(results) != len(requests):
        raise ValueError(f"{t.name} returned {len(results)} results for {len(requests)} requests")
    tensors, data = {}, {"tokens": [list(r.tokens) for r in results],
                         "finish_reasons": [r.finish_reason for r in results]}
    for i, r in enumerate(results):
        tensors[f"tokens_{i}"] = torch.tensor(list(r.tokens), dtype=torch.int64)
        tensors[f"logprobs_{i}"] = torch.as_tensor(r.logprobs).to(torch.float32).cpu()
        if inp["capture"]:
            tensors[f"captured_{i}"] = torch.as_tensor(r.captured).to(torch.float32).cpu()
        if inp["draft"] is not None:
            tensors[f"accept_lengths_{i}"] = torch.tensor(list(r.accept_lengths or []), dtype=torch.int64)
    if inp["draft"] is not None:
        data["mean_accept_length"] = [sum(r.accept_lengths) / len(r.accept_lengths) if r.accept_lengths else 0.0
                                      for r in results]
    reference = [_bits(r) for r in results]
    variants = []
    n = len(requests)
    if exp.get("reproducible"):
        variants.append(("a second run", lambda: run(requests)))
    if exp.get("batch_invariant"):
        variants.append(("each request alone", lambda: [run([r])[0] for r in requests]))
        variants.append(("reversed order", lambda: run(requests[::-1])[::-1]))
    for c in exp.get("prefill_chunks") or []:
        variants.append((f"prefill chunks of {c}", lambda c=c: run(requests, c)))
    if plain is not None:
        variants.append(("plain (non-speculative) generate", lambda: plain(requests, ckpt, None)))
    differing = {}
    for name, call in variants:
        got = call()
        differing[name] = [i for i in range(n) if not _same(_bits(got[i]), reference[i])]
    return Result(tensors=tensors, data=data, facts={"variants_differing": differing}), TOLERANCE, \
        kinds.generate.golden_platform(spec, ctx)


# --------------------------------------------------------------------------- draft
def _draft(spec, ctx, t: Target):
    """The draft head's internals on the aux rows of Lockstep's own target forward (or the
    spec's written-out aux), so the draft is judged apart from the target's forward."""
    from harness.checkpoints import draft_dir, draft_for, model_for, target_dir
    from harness.kinds import draft as D
    from harness.kinds.generate import project_root

    inp = spec.inputs
    op = t.op("draft_stages", str(ctx.device))
    root = project_root(spec)
    model = model_for(inp["target"], "torch", root, "cpu", "fp32")
    draft = draft_for(inp["draft"], inp["target"], model, root)        # Lockstep's: its boundaries and config
    aux, tokens, _ = D._rows(spec, model, draft)
    ddir = draft_dir(inp["draft"], inp["target"], root)
    stages = op(target_dir(inp["target"], root), ddir, inp["draft"]["convention"], aux.cpu(), tokens.cpu(),
                inp["top_k"])
    tensors = {"aux": aux.cpu()} | {k: torch.as_tensor(v).detach().cpu() for k, v in stages.items()}
    facts = {"checkpoint": str(ddir), "n_aux": draft.n_aux, "eps": draft.config.rms_norm_eps}
    if spec.expect.get("reproducible"):
        again = op(target_dir(inp["target"], root), ddir, inp["draft"]["convention"], aux.cpu(), tokens.cpu(),
                   inp["top_k"])
        facts["differs_on_rerun"] = [k for k, v in again.items() if not torch.as_tensor(v).cpu().contiguous()
                                     .view(torch.uint8).equal(tensors[k].contiguous().view(torch.uint8))]
    data = {"boundaries": list(draft.boundaries), "top_target_ids": tensors["top_target_ids"].tolist()}
    return Result(tensors=tensors, data=data, facts=facts), TOLERANCE, D.golden_platform(spec, ctx)


# --------------------------------------------------------------------------- mxfp4
def _mxfp4(spec, ctx, t: Target):
    """Decode mode: the target's `mxfp4_decode` on the spec's bytes, each value against the
    hand-written one and the golden bitwise. Checkpoint mode: the target's `load_checkpoint` of the
    edited checkpoint must refuse (a clean refusal naming the facts) or load."""
    from harness.kinds import mxfp4 as M

    inp = spec.inputs
    if inp["blocks"] is None:
        load = t.op("load_checkpoint", str(ctx.device))
        path = M.edited_checkpoint(spec)
        try:
            load(path)
        except (Refused, ValueError, *t.refusals) as e:
            return Result(data={"loaded": False, "error": str(e).replace(str(path), "<checkpoint>")}), BITWISE, None
        return Result(data={"loaded": True}), BITWISE, None
    decode = t.op("mxfp4_decode", str(ctx.device))
    dt = M.DTYPES[inp["dtype"]]
    n, rows = len(inp["blocks"]), inp["rows"]
    blocks = torch.tensor([b["bytes"] for b in inp["blocks"]], dtype=torch.uint8).reshape(rows, n // rows, 16)
    scales = torch.tensor([b["scale"] for b in inp["blocks"]], dtype=torch.uint8).reshape(rows, n // rows)
    out = torch.as_tensor(decode(blocks, scales, dt)).cpu()
    failures = []
    if tuple(out.shape) != (rows, n // rows * 32) or out.dtype != dt:
        failures.append(f"{t.name}: mxfp4_decode returned {out.dtype} {list(out.shape)}, expected {dt} "
                        f"[{rows}, {n // rows * 32}]")
    else:
        flat = out.reshape(n, 32)
        for b, want_row in enumerate(spec.expect["values"]):
            for e, want in enumerate(want_row):
                if not M._same(flat[b, e], want, dt):
                    failures.append(f"{M._describe_element(b, e, inp['blocks'][b])}: decoded "
                                    f"{float(flat[b, e])!r}, DESIGN §7 gives {want!r}")
    return Result(tensors={"values": out}, facts={"failures": failures}), BITWISE, M.golden_platform(spec, ctx)


# --------------------------------------------------------------------------- distribution
def _distribution_call(spec, t: Target, device: str):
    sp = spec.inputs["speculative"]
    needs = ("sampling", "batch", sp["verify"]) + (("tree",) if sp["topk"] > 1 else ())
    return t.op("speculative_generate", device, needs)


def _distribution(spec, ctx, t: Target):
    """The target's speculative sampling, counted, against the exact law of Lockstep's own forward
    of the same checkpoint (the kind's chi-square test and acceptance bounds; no golden: a target
    may draw from its own RNG and still follow the law)."""
    import dataclasses

    from harness.checkpoints import draft_dir, model_for, target_dir
    from harness.kinds import distribution as D
    from harness.kinds.generate import project_root

    inp = spec.inputs
    op = _distribution_call(spec, t, str(ctx.device))
    root = project_root(spec)
    params, sp, K = D._sampling_params(inp), D._spec_params(inp), inp["tokens"]
    prompt = materialize(inp["prompt"]).tolist()
    requests = [Request(prompt, params, seed=s) for s in materialize(inp["seeds"]).tolist()]
    results = op(target_dir(inp["checkpoint"], root), draft_dir(inp["draft"], inp["checkpoint"], root),
                 inp["draft"]["convention"], requests, dataclasses.asdict(sp))
    model = model_for(inp["checkpoint"], "torch", root, "cpu", "fp32")
    V = model.config.vocab_size
    counts = torch.zeros([V] * K, dtype=torch.int64)
    for r in results:
        counts[tuple(list(r.tokens)[:K])] += 1
    law = D.exact_law(model, prompt, params, K)
    test = D.chi_square(counts, law, inp["min_expected"])
    rounds = [a for r in results for a in (r.accept_lengths or [])]
    data = {"requests": len(requests), "rounds": len(rounds),
            "acceptance_rate": sum(a > 1 for a in rounds) / max(len(rounds), 1),
            "statistic": test.statistic, "df": test.df, "p_value": test.p_value,
            "impossible": [[list(seq), c] for seq, c in test.impossible],
            "largest_terms": [[list(n) if isinstance(n, tuple) else n, o, e] for n, o, e in test.largest]}
    return Result(tensors={"counts": counts, "expected": law}, data=data), CHI_SQUARE, None


# --------------------------------------------------------------------------- prefix-cache
def _prefix_cache_call(spec, t: Target, device: str):
    from harness.kinds.generate import SAMPLING, _params

    inp = spec.inputs
    params = _params({**SAMPLING.check({}, (), []), **(inp["sampling"] or {})})
    needs = (("sampling",) if not params.is_greedy else ()) + (("prefill_chunk",) if inp["prefill_chunk"] else ())
    return t.op("prefix_cache", device, needs), params


def _prefix_cache(spec, ctx, t: Target):
    """The kind's cases through the target's own prefix cache: every cold run is a fresh, empty
    cache's run (which must reuse nothing), every warm run goes through the case's cache; a hit
    must give the cold bits of the same target, and its counters the predicted reuse."""
    from harness.checkpoints import target_dir
    from harness.kinds import prefix_cache as P
    from harness.kinds.generate import project_root

    inp = spec.inputs
    new_cache, p = _prefix_cache_call(spec, t, str(ctx.device))
    ckpt = target_dir(inp["checkpoint"], project_root(spec))
    kw = {"prefill_chunk": inp["prefill_chunk"]} if inp["prefill_chunk"] else {}
    cold_reuse = []

    def run(cache, prompt):
        req = Request(list(prompt), p, seed=inp["seed"])
        out = list(cache.generate([req], **kw))
        if len(out) != 1:
            raise ValueError(f"{t.name}'s prefix cache returned {len(out)} results for 1 request")
        return out[0]

    def cold(prompt):
        cache = new_cache(ckpt, inp["block"])
        out = run(cache, prompt)
        if cache.hit_tokens:
            cold_reuse.append(f"a fresh cache reused {cache.hit_tokens} positions of the cold run of "
                              f"{len(prompt)} tokens")
        return out
    result = P.run_cases(spec, cold=cold, new_cache=lambda: new_cache(ckpt, inp["block"]), warm=run,
                         counters=lambda c: (int(c.hits), int(c.hit_tokens)))
    result.facts["differing"] = cold_reuse + result.facts["differing"]
    return result, TOLERANCE, P.golden_platform(spec, ctx)


KIND_RUNNERS = {
    "coins": _coins, "layer_ids": _layer_ids, "verify": _verify, "kernel": _kernel, "generate": _generate,
    "draft": _draft, "distribution": _distribution, "mxfp4": _mxfp4, "prefix-cache": _prefix_cache,
}


# --------------------------------------------------------------------------- refusals judged by their facts
_NUMBER = re.compile(r"(?<![\w.-])-?\d+(?![\w.])")
_TENSOR = re.compile(r"^[A-Za-z_][\w]*(\.[\w]+)+$")       # model.layers.2.mlp.experts.down_proj_scales


def error_facts(fragments: list[str]) -> list:
    """The facts an error spec's expected fragments name — whole numbers (ids, bounds, counts,
    widths, indices) and tensor names: a target's refusal must name these, in its own words."""
    return [f for f in fragments if _TENSOR.match(f)] + \
        [int(m) for f in fragments if not _TENSOR.match(f) for m in _NUMBER.findall(f)]


def _missing_facts(fragments: list[str], message: str) -> list:
    named = {int(m) for m in _NUMBER.findall(message)}
    return [f for f in error_facts(fragments) if (f not in message if isinstance(f, str) else f not in named)]


def check_on_target(spec, result: Result) -> list[str]:
    """The kind's checks, except that an expected refusal is judged by its facts, not its wording."""
    error = spec.expect.get("error") if isinstance(spec.expect, dict) else None
    if spec.kind == "layer_ids" and error and "error" in result.data:
        missing = _missing_facts(error, result.data["message"])
        return [f"the refusal does not name {missing}: {result.data['message']}"] if missing else []
    if spec.kind == "mxfp4" and error and result.data.get("loaded") is False:
        missing = _missing_facts(error, result.data["error"])
        return [f"the refusal does not name {missing}: {result.data['error']}"] if missing else []
    return list(kinds.KINDS[spec.kind].check(spec, result))


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
        fails = check_on_target(spec, result)
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
    except Exception as e:                  # the implementation under test crashed: one located line
        crash = f"crash: {type(e).__name__}: {e}".strip().splitlines()[0]
        out.status, out.traceback = FAIL, full_traceback(e)
        out.messages = [crash + (f" (at {where(e)})" if where(e) else "")]
        out.message = crash[:300]           # what an expectations file records: no path of this machine
    if out.status == FAIL and not out.message:
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
            _generate_plan(spec, t, device)
            return TOLERANCE, ""
        if spec.kind == "draft":
            t.op("draft_stages", device)
            return TOLERANCE, ""
        if spec.kind == "mxfp4":
            t.op("mxfp4_decode" if inp["blocks"] is not None else "load_checkpoint", device)
            return BITWISE, ""
        if spec.kind == "distribution":
            _distribution_call(spec, t, device)
            return CHI_SQUARE, ""
        if spec.kind == "prefix-cache":
            _prefix_cache_call(spec, t, device)
            return TOLERANCE, ""
        raise NotApplicable(f"kind {spec.kind}")
    except NotApplicable as e:
        return NA, str(e)
