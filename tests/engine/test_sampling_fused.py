"""The fused sampling kernel (kernels.sampling.sample_fused_triton, in the interpreter here) gives
the torch path's bits on every row: tokens, chosen logprobs and target distributions, with
greedy, seeded, filtered, tied, masked and NaN rows mixed in one batch (DESIGN §5). On a GPU
machine the same tests run the compiled kernel against torch's CUDA path (CPU tensors reach
Triton only through the interpreter)."""

from __future__ import annotations

import random

import pytest
import torch

from lockstep.engine.sampling import (SamplingParams, chosen_logprobs, chosen_logprobs_fused, row_settings, sample_fused,
                             sample_with, target_distributions, target_distributions_fused)
from lockstep.engine.speculative import target_probs
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
    torch_tokens = sample_with(logits, settings, positions)
    tokens, lps = sample_fused(logits, settings, positions)
    assert tokens.tolist() == torch_tokens.tolist(), params
    assert torch.equal(_bits(lps), _bits(chosen_logprobs(logits, torch_tokens)))
    assert torch.equal(_bits(chosen_logprobs_fused(logits, torch_tokens)), _bits(lps))
    sampled = [r for r in range(R) if not params[r].is_greedy]
    if sampled:
        rows = logits[sampled]
        ps = [params[r] for r in sampled]
        batched = target_distributions(rows, ps)
        assert torch.equal(_bits(target_distributions_fused(rows, ps)), _bits(batched))
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
    assert torch.equal(_bits(target_distributions_fused(x, ps)), _bits(target_distributions(x, ps)))


@pytest.mark.parametrize("chunks", [1, 2, 4, 8])
def test_a_row_split_over_programs_keeps_its_bits(chunks):
    """sample_fused_triton splits each row over `chunks` programs (the subtrees of the tree sum,
    the chunks' maxima and argmaxes merged after): every split gives the torch path's bits. V =
    9000 has 9 blocks of 1024 over Q = 8 leaves, so at 8 chunks the last chunk's argmax walks
    the folded tail block alone and some chunks of 2 walk none; rows are greedy, seeded (one
    with ties, one with a NaN, one half masked) and forced."""
    from lockstep.kernels.sampling import FORCED, GREEDY, SEEDED, fused_temperature, sample_fused_triton
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 9000, generator=g) * 3
    x[1, :] = 1.5                                            # every logit tied
    x[2, 4321] = float("nan")
    x[3, :4500] = float("-inf")
    x[4, [17, 8999]] = 40.0                                  # a greedy tie across the first and last chunk
    x = x.to(DEV)
    modes = torch.tensor([SEEDED, SEEDED, SEEDED, SEEDED, GREEDY, FORCED], dtype=torch.int32, device=DEV)
    temps = torch.tensor([fused_temperature(t, DEV) for t in (1.0, 1.3, 0.8, 1.0, 1.0, 1.0)], dtype=torch.float64,
                         device=DEV)
    seeds = torch.tensor([11, -12, 13, 14, 0, 0], device=DEV)
    positions = torch.tensor([5, 6, 7, 8, 9, 10], device=DEV)
    forced = torch.tensor([0, 0, 0, 0, 0, 8123], device=DEV)
    want = sample_fused_triton(x, modes, temps, seeds, positions, forced, chunks=1)
    got = sample_fused_triton(x, modes, temps, seeds, positions, forced, chunks=chunks)
    assert got[0].tolist() == want[0].tolist() and want[0][4].item() == 17 and want[0][5].item() == 8123
    assert torch.equal(_bits(got[1]), _bits(want[1]))
    params = [SamplingParams(temperature=t) for t in (1.0, 1.3, 0.8, 1.0)] + [SamplingParams(temperature=0)]
    settings = row_settings(params, [11, -12, 13, 14, None], DEV)
    assert want[0][:5].tolist() == sample_with(x[:5], settings, positions[:5]).tolist()
    assert torch.equal(_bits(want[1]), _bits(chosen_logprobs(x, want[0])))


@pytest.mark.parametrize("chunks", [0, 3, 16, True])
def test_a_split_that_is_not_a_power_of_two_within_the_tree_is_refused(chunks):
    """chunks must be a power of two from 1 to the row's Q leaf blocks (V = 5000: Q = 4)."""
    from lockstep.kernels.sampling import GREEDY, sample_fused_triton
    x = torch.zeros(1, 5000, device=DEV)
    z = torch.zeros(1, dtype=torch.int64, device=DEV)
    with pytest.raises(ValueError, match="chunks must be a power of two"):
        sample_fused_triton(x, torch.tensor([GREEDY], dtype=torch.int32, device=DEV),
                            torch.ones(1, dtype=torch.float64, device=DEV), z, z, z, chunks=chunks)
