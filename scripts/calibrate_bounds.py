"""Measure the spread between correct implementations of the reference, per dtype policy: the
numbers behind harness/targets/bounds.py (docs/targets.md, "The calibrated judge").

    python3 scripts/calibrate_bounds.py [SPEC_ID ...]        # default: every generate spec without a draft
    python3 scripts/calibrate_bounds.py --states              # the layer_ids forward specs' bf16 drift

For each spec, the fp32 reference's own tokens (Lockstep's torch backend, fp32) are scored
teacher-forced (lockstep.engine.generate.score) by a second correct implementation at each dtype:
  fp32  Lockstep's `fast` backend (BLAS GEMMs, library reductions: the numerics of an ordinary
        fp32 engine such as HF eager, not batch invariant);
  bf16  Lockstep's torch backend under the bf16 policy (bf16 weights and activations).
Per dtype it prints the largest per-spec p50, p99 and max of |logprob difference| over the scored
tokens, and `flip`: the largest margin of the reference's choice at a step where the second
implementation would choose another token. harness/targets/bounds.py derives the bounds from them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))        # this checkout's lockstep, not an installed copy

from lockstep.engine.generate import generate, score  # noqa: E402
from lockstep.engine.model import GptOssModel  # noqa: E402
from lockstep.harness.checkpoints import target_dir  # noqa: E402
from lockstep.harness.kinds.generate import _requests, project_root  # noqa: E402
from lockstep.harness.specfile import load_spec_file, spec_files  # noqa: E402

SECOND = {"fp32": ("fast", "fp32"), "bf16": ("torch", "bf16")}


def specs(ids: list[str]):
    for f in spec_files(ROOT / "specs"):
        spec = load_spec_file(f, ROOT / "specs")
        if spec.kind == "generate" and spec.inputs["draft"] is None and not spec.inputs.get("topologies") \
                and (not ids or spec.id in ids):
            yield spec


def spread(spec, dtype: str) -> tuple[torch.Tensor, list[float]]:
    """(|logprob differences| of every token of the fp32 reference's run, scored by `dtype`'s second
    implementation; the reference's margins at the steps where the two would choose differently)."""
    ckpt = target_dir(spec.inputs["checkpoint"], project_root(spec))
    requests = _requests(spec)
    reference = GptOssModel.from_checkpoint(ckpt)
    tokens = [r.tokens for r in generate(reference, requests)]
    ours = score(reference, requests, tokens)
    backend, policy = SECOND[dtype]
    theirs = score(GptOssModel.from_checkpoint(ckpt, backend=backend, dtype=policy), requests, tokens)
    deltas = torch.cat([(t.logprobs.double() - o.logprobs.double()).abs() for t, o in zip(theirs, ours)])
    flips = [o.margin[k] for t, o in zip(theirs, ours) for k in range(len(o.choice)) if t.choice[k] != o.choice[k]]
    return deltas, flips


def state_drift() -> int:
    """Per layer_ids forward spec: the largest |bf16 - fp32| of its captured states over their largest
    |value|, read from the recorded cpu goldens (why those specs are judged at fp32 only)."""
    from lockstep.harness.golden import GoldenStore
    store = GoldenStore(ROOT / "golden")
    for spec in (load_spec_file(f, ROOT / "specs") for f in spec_files(ROOT / "specs")):
        if spec.kind != "layer_ids" or not spec.inputs["forward"]:
            continue
        a, b = (store.load(p, spec.id).tensors["captured"].double() for p in ("cpu-fp32", "cpu-bf16"))
        print(f"{spec.id:<40} bf16 vs fp32: max |d| / max |state| = {float((a - b).abs().max() / a.abs().max()):.3g}")
    return 0


def main(argv: list[str]) -> int:
    if argv == ["--states"]:
        return state_drift()
    worst = {d: {"p50": 0.0, "p99": 0.0, "max": 0.0, "flip": 0.0} for d in SECOND}
    for spec in specs(argv):
        for dtype in SECOND:
            d, flips = spread(spec, dtype)
            q = torch.quantile(d, torch.tensor([0.5, 0.99], dtype=torch.float64)).tolist()
            flip = max(flips, default=0.0)
            print(f"{spec.id:<36} {dtype}  p50 {q[0]:.3g}  p99 {q[1]:.3g}  max {float(d.max()):.3g}  "
                  f"({d.numel()} tokens; {len(flips)} other choices, largest reference margin {flip:.3g})", flush=True)
            for key, value in (("p50", q[0]), ("p99", q[1]), ("max", float(d.max())), ("flip", flip)):
                worst[dtype][key] = max(worst[dtype][key], value)
    for dtype, w in worst.items():
        print(f"SPREAD {dtype} " + " ".join(f"{k}={v:.6g}" for k, v in w.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
