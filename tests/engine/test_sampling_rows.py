"""engine.sampling.sample_rows: a batch sampled at once gives, row for row, the bits of
engine.sampling.sample called on each row alone (the contract generate() relies on)."""

from __future__ import annotations

import random

import pytest
import torch

from engine.sampling import SamplingParams, chosen_logprob, chosen_logprobs, sample, sample_rows


def _params(rng: random.Random) -> SamplingParams:
    kind = rng.randrange(6)
    if kind == 0:
        return SamplingParams(greedy=True)
    return SamplingParams(temperature=rng.choice([0.0, 0.3, 0.7, 1.0, 1.3]),
                          top_k=rng.choice([0, 0, 1, 3, 17]),
                          top_p=rng.choice([1.0, 1.0, 0.5, 0.9, 0.999]),
                          min_p=rng.choice([0.0, 0.0, 0.05, 0.2]))


def _logits(R: int, V: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(R, V, generator=gen) * 3
    x[0, 1] = x[0, 3] = x[0].max() + 1          # an exact tie for the greedy first maximum
    if R > 1:
        x[1, :V // 2] = float("-inf")            # masked-out half
        x[1, V - 4:V - 1] = x[1, V - 1]          # ties inside the sorted masks
    return x


@pytest.mark.parametrize("case", range(12))
def test_rows_equal_one_at_a_time(case):
    rng = random.Random(case)
    gen = torch.Generator().manual_seed(case)
    R, V = rng.choice([1, 2, 5, 9]), rng.choice([7, 64, 301])
    logits = _logits(R, V, gen)
    params = [_params(rng) for _ in range(R)]
    seeds = [rng.choice([None, rng.randrange(-2**63, 2**64)]) for _ in range(R)]
    positions = [rng.randrange(0, 5000) for _ in range(R)]
    one_gen, rows_gen = torch.Generator().manual_seed(99), torch.Generator().manual_seed(99)
    alone = [sample(logits[r], params[r], seeds[r], positions[r], one_gen) for r in range(R)]
    together = sample_rows(logits, params, seeds, positions, rows_gen)
    assert together.tolist() == alone, (params, seeds)
    lps = chosen_logprobs(logits, together)
    for r in range(R):
        assert torch.equal(lps[r], chosen_logprob(logits[r], alone[r]))
    assert torch.equal(one_gen.get_state(), rows_gen.get_state())   # the same draws were taken


def test_unseeded_row_without_generator_is_refused():
    with pytest.raises(ValueError, match="explicit torch.Generator"):
        sample_rows(torch.zeros(1, 4), [SamplingParams()], [None], [0])
