"""The `generate` spec kind: validation, and that its D2/D3 checks can fail."""

import pytest
import torch.nn.functional as F

from harness.kinds import generate as kind
from harness.platform import detect
from harness.result import RunContext
from harness.specfile import SpecErrors, parse_spec

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
    spec = parse_spec(SPEC, "f.yaml", "g/x")
    result = kind.run(spec, RunContext(detect("cpu")))
    assert kind.check(spec, result) == []
    assert sorted(result.tensors) == ["logprobs_0", "logprobs_1", "tokens_0", "tokens_1"]


def test_a_batch_variant_linear_fails_the_d2_and_d3_checks(monkeypatch):
    """torch's own matmul over all rows at once (MKL: M = 1 differs from M >= 2) must be caught."""
    def batched_linear(x, weight, bias=None, backend="torch"):
        return F.linear(x, weight, bias)

    monkeypatch.setattr("engine.model.linear", batched_linear)
    spec = parse_spec(SPEC, "f.yaml", "g/x")
    fails = kind.check(spec, kind.run(spec, RunContext(detect("cpu"))))
    assert any("each request alone" in f or "prefill chunks of 5" in f for f in fails), fails
