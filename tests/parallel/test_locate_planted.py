"""`lockstep check --json` (and `diff`) locate a divergence planted at TP 2 over gloo: one rank
adds its own o_proj / down partials left to right instead of as their subtree of the fixed tree
(tests/parallel/wrong_orders.one_rank_sequential). Both ranks then agree with each other and
part from one device at the first row-parallel reduction: the prefill (step 0) of request 0,
boundary 1 (layer 0), op L0.o_proj, with the o_proj partials themselves still equal. Plain
generation (captured states) and seeded speculative decoding (rejection chain) alike."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from lockstep.engine import parallel

from tests.parallel import wrong_orders

REPO = Path(__file__).resolve().parents[2]

GENERATE = """\
kind: generate
description: TP 2 against one device, boundary states captured
inputs:
  checkpoint: {preset: tiny-parallel, seed: 0}
  capture: [1, 2]
  topologies: [[2, 1]]
  requests:
    - {prompt: {hashed: {count: 20, seed: 1, below: 500}}, sampling: {greedy: true, max_new_tokens: 3}}
    - {prompt: {hashed: {count: 9, seed: 2, below: 500}}, seed: 7, sampling: {top_k: 20, max_new_tokens: 3}}
"""

SPECULATIVE = """\
kind: generate
description: seeded rejection chains with the fitted pair, the target at TP 2
inputs:
  checkpoint: {path: models/tiny-target}
  draft: {path: models/tiny-eagle3, convention: sglang}
  speculative: {num_steps: 3, topk: 1, draft_token_num: 4, verify: rejection}
  topologies: [[2, 1]]
  requests:
    - {prompt: [301, 59, 396, 248, 367, 433, 371, 5], seed: 41, sampling: {temperature: 3.0, max_new_tokens: 6}}
    - {prompt: [174, 465, 74, 484, 150, 429, 242, 412], sampling: {greedy: true, max_new_tokens: 6}}
"""


def test_a_wrong_reduction_order_on_one_rank_is_located_to_the_o_proj_reduction(tmp_path, monkeypatch, capsys):
    from lockstep.harness.cli import main
    specs = tmp_path / "specs" / "generate"
    specs.mkdir(parents=True)
    (specs / "tp2.yaml").write_text(GENERATE)
    (specs / "tp2-speculative.yaml").write_text(SPECULATIVE)
    shutil.copytree(REPO / "models", tmp_path / "models")          # spec paths stay inside the project
    (tmp_path / "golden").mkdir(exist_ok=True)        # no golden in it: the spec's own checks judge
    monkeypatch.chdir(tmp_path)
    # the launching process hands the ranks these rank functions by name; each plants the order
    monkeypatch.setattr(parallel, "_generate_rank", wrong_orders.generate_rank_one_rank_sequential)
    monkeypatch.setattr(parallel, "_speculative_rank", wrong_orders.speculative_rank_one_rank_sequential)

    assert main(["check", "--json", "generate/*"]) == 1
    report = {s["id"]: s for s in json.loads(capsys.readouterr().out)["specs"]}
    # which request shows the planted order first is rounding luck (the lower index wins a tie of
    # steps); the speculative spec's seeded request 0 keeps its bits at step 0 since the sqrt became
    # correctly rounded, so its greedy request 1 is the first to part
    for spec_id, request, why in (("generate/tp2", 0, "captured states"),
                                  ("generate/tp2-speculative", 1, "logprob bits")):
        s = report[spec_id]
        assert s["status"] == "failed", spec_id
        (where,) = s["located"]
        assert (where["other"], where["request"], where["step"], where["token"]) == \
            ("topology tp=2 ep=1", request, 0, 0), spec_id
        assert why in where["differs"], (spec_id, where["differs"])
        rerun = where["rerun"]
        assert rerun["boundary"]["name"] == "boundary.1", spec_id
        assert rerun["op"]["name"] == "L0.o_proj", spec_id                 # the reduction, not the partials
        assert rerun["equal_before"] == 5, spec_id    # boundary.0, attn_norm, qkv, attention, o_proj.partials
        assert rerun["op"]["diff"]["n_diff"] > 0 and rerun["op"]["diff"]["sides"][1] == "topology tp=2 ep=1"
