"""The `generate` spec kind: validation, and that its D2/D3 checks can fail."""

import pytest
import torch.nn.functional as F

from lockstep.harness.kinds import generate as kind
from lockstep.harness.platform import detect
from lockstep.harness.result import RunContext
from lockstep.harness.specfile import SpecErrors, parse_spec
from lockstep.harness.targets.lockstep import engine

SPEC = """\
kind: generate
description: two short requests
inputs:
  checkpoint: {preset: tiny, seed: 0}
  requests:
    - {prompt: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], sampling: {greedy: true, max_new_tokens: 3}}
    - {prompt: [9, 8, 7], seed: 4, sampling: {max_new_tokens: 3}}
expect:
  batch_invariant: true
  prefill_chunks: [5]
"""


def test_a_sampled_request_without_seed_is_a_spec_error():
    with pytest.raises(SpecErrors) as e:
        parse_spec(SPEC.replace("seed: 4, ", ""), "f.yaml", "g/x")
    assert "needs a 'seed'" in str(e.value) and "inputs.requests[1]" in str(e.value)


def test_invalid_sampling_is_located_with_the_engine_message():
    with pytest.raises(SpecErrors) as e:
        parse_spec(SPEC.replace("max_new_tokens: 3}}\n", "max_new_tokens: 3, top_p: 0}}\n", 1), "f.yaml", "g/x")
    assert "SamplingParams.top_p: must be in (0, 1]" in str(e.value)


def test_checks_pass_on_the_engine():
    spec, ctx = parse_spec(SPEC, "f.yaml", "g/x"), RunContext(detect("cpu"))
    result = kind.run(spec, ctx, engine(ctx))
    assert kind.check(spec, result) == []
    assert sorted(result.tensors) == ["logprobs_0", "logprobs_1", "tokens_0", "tokens_1"]


def test_a_batch_variant_linear_fails_the_d2_and_d3_checks(monkeypatch):
    """torch's own matmul over all rows at once (MKL: M = 1 differs from M >= 2) must be caught."""
    from lockstep.engine import ops                 # not `import engine.ops`: it would shadow the default target `engine(ctx)`

    def batched_linear(x, weight, bias=None, out_dtype=None):
        return F.linear(x, weight, bias).to(out_dtype or x.dtype)

    spec, ctx = parse_spec(SPEC, "f.yaml", "g/x"), RunContext(detect("cpu"))
    real = ops.TORCH.linear
    object.__setattr__(ops.TORCH, "linear", batched_linear)      # the ops table is frozen on purpose
    try:
        fails = kind.check(spec, kind.run(spec, ctx, engine(ctx)))
    finally:
        object.__setattr__(ops.TORCH, "linear", real)
    assert any("each request alone" in f or "prefill chunks of 5" in f for f in fails), fails


def test_world_sizes_add_topologies_and_name_unsupported_splits():
    spec = parse_spec(SPEC.replace("expect:\n  batch_invariant: true\n  prefill_chunks: [5]\n", ""), "f.yaml", "g/x")
    ctx = RunContext(detect("cpu"), world_sizes=(1, 4))
    result = kind.run(spec, ctx, engine(ctx))
    # tiny has 2 KV heads (no TP 4) but 4 experts (EP 4 runs)
    assert list(result.facts["variants_differing"]) == ["topology tp=1 ep=4"]
    assert kind.check(spec, result) == []
    assert any("tp=4 ep=1" in n and "unsupported" in n for n in result.notes)


def test_paths_in_specs_cannot_leave_the_project(tmp_path):
    from lockstep.harness.checkpoints import resolve_path

    assert resolve_path("models/x", tmp_path) == (tmp_path / "models/x").resolve()
    for bad in ("../outside", "/etc", "models/../../x"):
        with pytest.raises(ValueError, match="leaves the project root"):
            resolve_path(bad, tmp_path)


def test_speculative_needs_a_draft_and_valid_params():
    with pytest.raises(SpecErrors) as e:
        parse_spec(SPEC.replace("expect:", "  speculative: {topk: 1}\nexpect:"), "f.yaml", "g/x")
    assert "'draft' and 'speculative' go together" in str(e.value)
    bad = SPEC.replace("expect:", "  draft: {seed: 1, convention: sglang}\n"
                                  "  speculative: {topk: 2, num_steps: 1, draft_token_num: 9}\nexpect:")
    with pytest.raises(SpecErrors) as e:
        parse_spec(bad, "f.yaml", "g/x")
    assert "SpecParams.draft_token_num" in str(e.value) and "inputs.speculative" in str(e.value)


def test_speculative_refuses_what_it_cannot_check_yet():
    text = SPEC.replace("expect:", "  draft: {seed: 1, convention: sglang}\n  speculative: {topk: 1}\n"
                                   "  capture: [1]\nexpect:")
    with pytest.raises(SpecErrors) as e:
        parse_spec(text, "f.yaml", "g/x")
    assert "inputs.capture: not supported with speculative decoding yet" in str(e.value)
    assert "expect.prefill_chunks: speculative decoding has no chunked prefill yet" in str(e.value)
