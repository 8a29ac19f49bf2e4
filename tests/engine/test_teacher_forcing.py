"""engine.teacher_forcing.teacher_force, the engine's prefill-shaped teacher forcing: a free run's
tokens scored in chunked, grouped forwards give the run's logprob bits (D3), whatever the chunk
and the grouping; engine.generate.score (step by step) gives the same bits."""

from __future__ import annotations

import pytest
import torch

from lockstep.engine.generate import generate, score
from lockstep.engine.request import Request, SamplingParams
from lockstep.engine.teacher_forcing import teacher_force


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@pytest.fixture(scope="module")
def free_run(tiny_model):
    reqs = [Request(prompt=[1, 2, 3, 4, 5], params=SamplingParams(temperature=1.0, max_new_tokens=7), seed=3),
            Request(prompt=[9, 8], params=SamplingParams(greedy=True, max_new_tokens=5)),
            Request(prompt=list(range(20, 31)), params=SamplingParams(temperature=0.7, top_k=5, max_new_tokens=6),
                    seed=11)]
    return reqs, generate(tiny_model, reqs)


@pytest.mark.parametrize("chunk,group", [(256, 8), (3, 2), (1, 1)])
def test_teacher_forcing_gives_the_free_runs_bits(tiny_model, free_run, chunk, group):
    reqs, results = free_run
    forced = teacher_force(tiny_model, reqs, [r.tokens for r in results], chunk, group)
    for want, got in zip(results, forced):
        assert got.tokens == want.tokens
        assert torch.equal(_bits(got.logprobs), _bits(want.logprobs))


def test_step_by_step_scoring_agrees_with_the_prefill_shape(tiny_model, free_run):
    reqs, results = free_run
    tokens = [r.tokens for r in results]
    for a, b in zip(teacher_force(tiny_model, reqs, tokens), score(tiny_model, reqs, tokens)):
        assert torch.equal(_bits(a.logprobs), _bits(b.logprobs))


def test_a_wrong_token_moves_only_its_own_logprob_and_later_ones(tiny_model, free_run):
    """Planted: one recorded token replaced; the logprobs before it keep their bits (causality)."""
    reqs, results = free_run
    tokens = [list(r.tokens) for r in results]
    tokens[0][3] = (tokens[0][3] + 1) % tiny_model.config.vocab_size
    got = teacher_force(tiny_model, reqs, tokens)[0].logprobs
    assert torch.equal(_bits(got[:3]), _bits(results[0].logprobs[:3]))
    assert not torch.equal(_bits(got[3:4]), _bits(results[0].logprobs[3:4]))
