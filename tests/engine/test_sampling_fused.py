"""The fused sampling kernel (kernels.sampling.sample_fused_triton, in the interpreter here) gives
the torch path's bits on every row: tokens, chosen logprobs and target distributions, with
greedy, seeded, filtered, tied, masked and NaN rows mixed in one batch (DESIGN §5). On a GPU
machine the same tests run the compiled kernel against torch's CUDA path (CPU tensors reach
Triton only through the interpreter)."""

from __future__ import annotations

import random

import pytest
import torch

from engine.sampling import (SamplingParams, chosen_logprobs, row_settings, sample_fused, sample_with,
                             target_distributions)
from engine.speculative import target_probs
from tests.engine.test_sampling_rows import _logits, _params


DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32 if t.element_size() == 4 else torch.int64)


@pytest.mark.parametrize("case", range(6))
def test_fused_equals_torch_path(case):
    rng = random.Random(100 + case)
    gen = torch.Generator().manual_seed(case)
    R, V = rng.choice([2, 5, 9]), rng.choice([7, 301, 1100, 5000])      # 5000: 4 blocks, bit-reversed
    logits = _logits(R, V, gen).to(DEV)
    params = [_params(rng) for _ in range(R)]
    seeds = [rng.randrange(-2**63, 2**64) for _ in range(R)]
    positions = torch.tensor([rng.randrange(0, 5000) for _ in range(R)], device=DEV)
    settings = row_settings(params, seeds, DEV)
    torch_tokens = sample_with(logits, settings, positions, fused=False)
    tokens, lps = sample_fused(logits, settings, positions)
    assert tokens.tolist() == torch_tokens.tolist(), params
    assert torch.equal(_bits(lps), _bits(chosen_logprobs(logits, torch_tokens, fused=False)))
    assert torch.equal(_bits(chosen_logprobs(logits, torch_tokens, fused=True)), _bits(lps))
    sampled = [r for r in range(R) if not params[r].is_greedy]
    if sampled:
        rows = logits[sampled]
        ps = [params[r] for r in sampled]
        batched = target_distributions(rows, ps, fused=False)
        assert torch.equal(_bits(target_distributions(rows, ps, fused=True)), _bits(batched))
        for k, (row, p) in enumerate(zip(rows, ps)):                  # the row-by-row definition
            assert torch.equal(_bits(batched[k]), _bits(target_probs(row, p)))


def test_unseeded_rows_stay_on_the_torch_path():
    settings = row_settings([SamplingParams(), SamplingParams(temperature=0)], [None, 1], "cpu")
    assert settings.fused is None


def test_tree_order_over_blocks():
    """The float64 denominator over 4 blocks of 1024 ids (V = 5000 folds 904 onto them): its order
    decides the last bit of a row's sum about one row in six, so 24 rows pin it."""
    x = (torch.randn(24, 5000, generator=torch.Generator().manual_seed(0)) * 3).to(DEV)
    ps = [SamplingParams(temperature=1.0)] * 24
    assert torch.equal(_bits(target_distributions(x, ps, fused=True)), _bits(target_distributions(x, ps, fused=False)))
