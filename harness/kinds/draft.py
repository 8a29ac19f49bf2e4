"""Spec kind `draft`: the EAGLE3 draft head's own computation, step by step (DESIGN §4).

    kind: draft
    description: …
    inputs:
      target: {preset: tiny, seed: 0}                  # the target the draft is bound to
      draft: {seed: 5, convention: sglang, aux_layer_ids: [1, 2, 4],
              norm_before_fc: true, fc_norm: true, d2t: true}   # or {path: models/tiny-eagle3, convention: …}
      prompt: {hashed: {count: 12, seed: 3, below: 500}}   # aux = the target's captured boundary states
      # or, written out: aux: [[…A values…], …] (one row per position) with tokens: [...]
      top_k: 4                                         # the draft's deterministic top-k per row
    expect:
      fc_input_tolerance: 1.0e-5   # |fc input - DESIGN §4 recomputed here in float64| <= this (+ 2 bf16 ulps under bf16)
      top_k_rule: true             # top ids = the k largest logits, equal logits by the lower draft id
      d2t_mapping: true            # target id = draft id + d2t[draft id], d2t read from the checkpoint
      min_tied_rows: 3             # at least this many rows have equal logits among their top k + 1
      reproducible: true           # a second run gives the same bits

With `prompt`, the target runs a forward of it capturing the draft's boundaries; row t (t = 0 …
T - 2) is the draft step at position t, pairing the target feature h_t with the embedding of
prompt token t + 1 (DESIGN §4). With `aux`, row t is given aux row t and `tokens[t]` at position t.
All rows run as one committed draft step in one KV slot (row t attends to positions 0 … t).

The golden (per engine platform) holds every stage bitwise: `aux` [R, A], `fc_input` [R, A]
(after input_norm, then fc_norm per chunk), `fc_output` [R, H_draft], `hidden` [R, H_draft] (the
layer's pre-norm output, the next step's h), `logits` [R, V_draft], and the top-k as
`top_logprobs` (float64), `top_draft_ids` and `top_target_ids` [R, k]. The expectations are checked
by code of this module, independent of the engine: the fc input against DESIGN §4 in float64 from
the checkpoint's own norm weights, the top-k rule against a plain Python sort of the logits, and
the d2t map against the checkpoint's `d2t` tensor (absent: the identity).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from safetensors import safe_open

from lockstep.engine.config import preset
from lockstep.harness.checkpoints import (CHECKPOINT, DRAFT, checkpoint_problems, draft_dir, draft_for,
                                          draft_tie_problems, model_for, reference_model, target_dir)
from lockstep.harness.intseq import IntSeq, length, materialize
from lockstep.harness.kinds.generate import project_root
from lockstep.harness.result import SpecResult
from lockstep.harness.schema import Bool, Field, Float, Int, List, Map, Problem
from lockstep.harness.target import TOLERANCE, TargetInterface

NAME = "draft"

INPUTS = Map({
    "target": Field(CHECKPOINT, required=True, doc="the target checkpoint the draft is bound to"),
    "draft": Field(DRAFT, required=True),
    "prompt": Field(IntSeq(min_len=2, min_value=0), doc="aux from the target's forward of this prompt"),
    "aux": Field(List(List(Float(), min_len=1), min_len=1), doc="aux rows written out, [R, A]"),
    "tokens": Field(IntSeq(min_value=0), doc="with aux: the token embedded at each row"),
    "top_k": Field(Int(min=1), default=4),
})
EXPECT = Map({
    "fc_input_tolerance": Field(Float(), doc="max |fc input - DESIGN §4 in float64|"),
    "top_k_rule": Field(Bool(), default=False),
    "d2t_mapping": Field(Bool(), default=False),
    "min_tied_rows": Field(Int(min=1)),
    "reproducible": Field(Bool(), default=False),
})


def validate(doc: dict, root=None) -> list[Problem]:
    inp, out = doc["inputs"], []
    out += checkpoint_problems(inp["target"], ("inputs", "target"))
    out += draft_tie_problems(inp["draft"], inp["target"], ("inputs", "draft"))
    if "seed" in inp["draft"] and "preset" not in inp["target"]:
        out.append(Problem(("inputs", "draft"), "a synthetic draft needs a target given by preset"))
    if (inp["prompt"] is None) == (inp["aux"] is None):
        out.append(Problem(("inputs",), "give either 'prompt' (aux from a target forward) or 'aux' with 'tokens'"))
    if inp["prompt"] is not None and inp["tokens"] is not None:
        out.append(Problem(("inputs", "tokens"), "only with 'aux' (with 'prompt' the tokens are the prompt's)",
                           at_key=True))
    if inp["aux"] is not None:
        if inp["tokens"] is None or length(inp["tokens"]) != len(inp["aux"]):
            out.append(Problem(("inputs", "tokens"), f"expected one token per aux row ({len(inp['aux'])})"))
        widths = {len(r) for r in inp["aux"]}
        if len(widths) > 1:
            out.append(Problem(("inputs", "aux"), f"rows of different widths {sorted(widths)}"))
        elif "seed" in inp["draft"] and "preset" in inp["target"] and not checkpoint_problems(inp["target"], ()):
            A = 3 * preset(inp["target"]["preset"]).hidden_size    # make_draft_checkpoint: 3 aux states
            if widths != {A}:
                out.append(Problem(("inputs", "aux", 0), f"expected rows of A = 3 x target hidden = {A} values, "
                                                         f"found {widths.pop()}"))
    return out


def golden_platform(spec, ctx) -> str:
    return ctx.engine_platform


# --------------------------------------------------------------------------- the run
def _rows(spec, model, draft):
    """-> (aux [R, A] fp32, tokens [R]) of `model`'s forward (or the spec's written-out aux)."""
    inp = spec.inputs
    if inp["aux"] is not None:
        return torch.tensor(inp["aux"], dtype=torch.float32), materialize(inp["tokens"])
    prompt = materialize(inp["prompt"])
    T = prompt.shape[0]
    out = model.forward(prompt, torch.arange(T), torch.zeros(T, dtype=torch.int64), model.new_cache(1, T),
                        capture=draft.boundaries)
    return out.captured[:T - 1], prompt[1:]                          # h_t pairs with token t + 1


def run(spec, ctx, target: TargetInterface) -> SpecResult:
    """The target's `draft_stages` on the aux rows of a reference forward (`reference_model`: the
    target's own `model` where it exposes one, Lockstep's engine under the run's backend and dtype
    policy; else Lockstep's fp32 model) or the spec's written-out aux, so the draft is judged apart
    from the target's forward."""
    inp, exp = spec.inputs, spec.expect
    root = project_root(spec)
    ckpt, ddir, convention = target_dir(inp["target"], root), draft_dir(inp["draft"], inp["target"], root), \
        inp["draft"]["convention"]
    op = target.op("draft_stages", str(ctx.device))
    fp32 = model_for(inp["target"], "torch", root, "cpu", "fp32")
    draft = draft_for(inp["draft"], inp["target"], fp32, root)         # its layout, on Lockstep's fp32 model
    rows = _rows(spec, reference_model(target, inp["target"], root, str(ctx.device)), draft)

    def stages() -> dict:
        aux, tokens = rows
        got = op(ckpt, ddir, convention, aux.cpu(), tokens.cpu(), inp["top_k"])
        return {"aux": aux} | {k: torch.as_tensor(v) for k, v in got.items()}

    tensors = {n: t.detach().cpu().clone() for n, t in stages().items()}     # clone: no shared storage
    facts = {"checkpoint": str(ddir), "n_aux": draft.n_aux, "eps": draft.config.rms_norm_eps}
    if exp.get("reproducible"):
        facts["differs_on_rerun"] = [n for n, t in stages().items()
                                     if not t.detach().cpu().contiguous().view(torch.uint8)
                                     .equal(tensors[n].contiguous().view(torch.uint8))]
    data = {"boundaries": list(draft.boundaries), "top_target_ids": tensors["top_target_ids"].tolist()}
    return SpecResult(tensors=tensors, data=data, facts=facts)


def applicability(spec, target: TargetInterface, device: str) -> str:
    target.op("draft_stages", device)
    return TOLERANCE


def compared(spec, ctx, result: SpecResult) -> tuple[str, str]:
    """Every stage within the cross-implementation bound of the golden, and the kind's own checks."""
    return TOLERANCE, golden_platform(spec, ctx)


# --------------------------------------------------------------------------- independent checks
def _checkpoint_tensors(path: str) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(f, framework="pt") as sf:
            for n in sf.keys():
                out[n] = sf.get_tensor(n)
    return out


def design_fc_input(aux: torch.Tensor, w: dict[str, torch.Tensor], n_aux: int, eps: float) -> torch.Tensor:
    """DESIGN §4 in float64: input_norm over the whole vector (if present), then fc_norm per chunk."""
    def rms(x, weight):
        return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.to(torch.float64)

    legacy = ("aux_norm_low.weight", "aux_norm_mid.weight", "aux_norm_high.weight")
    x = aux.to(torch.float64)
    if "input_norm.weight" in w:
        x = rms(x, w["input_norm.weight"])
    chunk_w = [w.get(f"fc_norm.{i}.weight", w.get(legacy[i]) if i < 3 else None) for i in range(n_aux)]
    if all(c is not None for c in chunk_w):
        x = torch.cat([rms(c, cw) for c, cw in zip(x.chunk(n_aux, dim=-1), chunk_w)], dim=-1)
    return x


def _rounding_slack(want: torch.Tensor, stored: torch.dtype) -> torch.Tensor:
    """What storing the fc input in `stored` may add to |diff|: nothing for fp32; under the bf16
    policy two bf16 ulps of the value (each norm rounds once: input_norm's, then fc_norm's)."""
    if stored == torch.float32:
        return torch.zeros_like(want)
    _, e = torch.frexp(want)                                  # |want| = m * 2^e, m in [0.5, 1)
    return 2.0 * torch.ldexp(torch.ones_like(want), (e - 8).to(torch.int32))   # bf16 ulp = 2^(e - 1 - 7)


def check(spec, result: SpecResult) -> list[str]:
    exp, t, facts, fails = spec.expect, result.tensors, result.facts, []
    k = spec.inputs["top_k"]
    w = _checkpoint_tensors(facts["checkpoint"]) if (exp.get("fc_input_tolerance") is not None
                                                     or exp.get("d2t_mapping")) else {}
    if exp.get("fc_input_tolerance") is not None:
        want = design_fc_input(t["aux"], w, facts["n_aux"], facts["eps"])
        err = (t["fc_input"].to(torch.float64) - want).abs().nan_to_num(nan=math.inf)
        err = err - _rounding_slack(want, t["fc_input"].dtype)
        if err.numel() and float(err.max()) > exp["fc_input_tolerance"]:
            r, c = (err == err.max()).nonzero()[0].tolist()
            fails.append(f"fc input [{r}, {c}] = {float(t['fc_input'][r, c]):.6g}, DESIGN §4 (input_norm over all "
                         f"of A, then fc_norm per chunk) gives {float(want[r, c]):.6g}: |diff| {float(err.max()):.3g} "
                         f"> {exp['fc_input_tolerance']:.3g}")
    if exp.get("top_k_rule") or exp.get("min_tied_rows") is not None:
        tied_rows = []
        for r, row in enumerate(t["logits"].tolist()):
            ranked = sorted(range(len(row)), key=lambda d: (-row[d], d))
            want = ranked[:k]
            got = t["top_draft_ids"][r].tolist()
            if exp.get("top_k_rule") and got != want:
                fails.append(f"row {r}: the draft's top-{k} is {got}, the {k} largest logits with equal logits by "
                             f"the lower draft id are {want} (logits {[row[d] for d in want]})")
            top = [row[d] for d in ranked[:k + 1]]
            if len(set(top)) < len(top):
                tied_rows.append(r)
        if exp.get("min_tied_rows") is not None and len(tied_rows) < exp["min_tied_rows"]:
            fails.append(f"only rows {tied_rows} have equal logits among their top {k + 1}; the spec needs "
                         f"{exp['min_tied_rows']} (the tie rule would go unexercised)")
    if exp.get("d2t_mapping"):
        d2t = w.get("d2t")
        ids = t["top_draft_ids"]
        want = ids + (d2t.to(torch.int64)[ids] if d2t is not None else 0)
        if not torch.equal(t["top_target_ids"], want):
            r = int((t["top_target_ids"] != want).any(-1).nonzero()[0, 0])
            fails.append(f"row {r}: draft ids {ids[r].tolist()} map to target ids {t['top_target_ids'][r].tolist()}, "
                         f"d + d2t[d] gives {want[r].tolist()}" + ("" if d2t is not None else " (no d2t: identity)"))
    if facts.get("differs_on_rerun"):
        fails.append(f"a second run gave different bits in {facts['differs_on_rerun']}")
    return fails
