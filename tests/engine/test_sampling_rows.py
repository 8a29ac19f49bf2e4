"""lockstep.engine.sampling.sample_rows: a batch sampled at once gives, row for row, the bits of
engine.sampling.sample called on each row alone (the contract generate() relies on)."""

from __future__ import annotations

import random

import pytest
import torch

from lockstep.engine.sampling import TORCH_SAMPLER, SamplingParams, chosen_logprob, chosen_logprobs, sample, sample_rows


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
    if R > 2:
        x[2, 0] = float("nan")                   # a NaN row: the filters it has off must keep it all
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
        assert lps[r].view(torch.int32) == chosen_logprob(logits[r], alone[r]).view(torch.int32)   # bits, NaN too
    assert torch.equal(one_gen.get_state(), rows_gen.get_state())   # the same draws were taken


def test_unseeded_row_without_generator_is_refused():
    with pytest.raises(ValueError, match="explicit torch.Generator"):
        sample_rows(torch.zeros(1, 4), [SamplingParams()], [None], [0])


def test_filter_masks_equal_keep_mask_row_by_row():
    """The masks themselves, on rows where the filters decide: a mass that rounds to exactly 1.0
    before the tail (top_p = 1 must keep the tail all the same), ties at every cut."""
    from lockstep.engine.sampling import keep_mask, row_settings, keep_mask_rows
    V = 50
    z = torch.randn(6, V, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    z[0] = -40.0
    z[0, 7] = 0.0                                # p = 1.0 exactly, then a tail of ~4e-18 each
    z[1, 10:20] = 2.5                            # ties across the top-k and top-p cuts
    params = [SamplingParams(top_p=1.0, min_p=0.0), SamplingParams(top_k=12, top_p=0.6),
              SamplingParams(min_p=0.3), SamplingParams(top_k=1), SamplingParams(top_p=0.999, min_p=0.01),
              SamplingParams()]
    st = row_settings(params, [1] * 6, "cpu")
    together = keep_mask_rows(z, st.top_k, st.top_p, st.min_p)
    for r, p in enumerate(params):
        assert torch.equal(together[r], keep_mask(z[r], p.top_k, p.top_p, p.min_p)), r
    assert together[0].all()


def test_sample_graph_equals_sample_rows():
    """lockstep.engine.graphs.SampleGraph (eager on the CPU, the same calls it captures on a GPU)."""
    from lockstep.engine.graphs import SampleGraph
    from lockstep.engine.sampling import row_settings
    rng = random.Random(5)
    logits = _logits(6, 301, torch.Generator().manual_seed(5))
    params = [_params(rng) for _ in range(6)]
    seeds = [rng.randrange(2**64) for _ in range(6)]
    sampler = SampleGraph(TORCH_SAMPLER, row_settings(params, seeds, "cpu"), 6, 301, "cpu")
    for positions in ([3, 9, 27, 81, 243, 729], [4, 10, 28, 82, 244, 730]):
        tokens, lps = sampler(logits, torch.tensor(positions))
        expected = sample_rows(logits, params, seeds, positions)
        assert torch.equal(tokens, expected)
        assert torch.equal(lps.view(torch.int32), chosen_logprobs(logits, expected).view(torch.int32))
    with pytest.raises(ValueError, match="not capturable"):
        SampleGraph(TORCH_SAMPLER, row_settings([SamplingParams()], [None], "cpu"), 1, 301, "cpu")


def test_a_nan_row_with_its_filters_off_keeps_every_entry_beside_rows_that_filter():
    """keep_mask skips a filter that is off, so even a NaN row keeps everything; keep_mask_rows
    must do the same through its off flags when other rows of the batch use the filters (found
    by mutation testing: a wrong min_p off flag only showed on such a row)."""
    from lockstep.engine.sampling import keep_mask, keep_mask_rows, row_settings
    z = torch.randn(3, 20, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    z[1, 5] = float("nan")
    params = [SamplingParams(top_k=3, top_p=0.5, min_p=0.2), SamplingParams(), SamplingParams(min_p=0.1)]
    st = row_settings(params, [1, 2, 3], "cpu")
    together = keep_mask_rows(z, st.top_k, st.top_p, st.min_p)
    for r, p in enumerate(params):
        assert torch.equal(together[r], keep_mask(z[r], p.top_k, p.top_p, p.min_p)), r
    assert together[1].all(), "the NaN row has every filter off: all of it is kept"
    assert st.top_p.dtype == st.min_p.dtype == torch.float64, "thresholds compared in float64, as keep_mask's floats"


@pytest.mark.parametrize("filters", [dict(top_k=1), dict(top_p=0.05), dict(min_p=0.99)])
def test_each_filter_decides_the_sampled_token(filters):
    """A nearly flat row: unfiltered, the seeded draws spread over the vocabulary; with a filter
    that keeps only the top entry, every draw is that entry (each filter must reach the sampler)."""
    logits = torch.linspace(1.0, 0.9, 8).repeat(2, 1)
    params = [SamplingParams(**filters), SamplingParams()]
    drawn = [sample_rows(logits, params, [seed, seed], [seed, seed]).tolist() for seed in range(24)]
    assert {row[0] for row in drawn} == {0}, (filters, drawn)
    assert len({row[1] for row in drawn}) > 2, "the unfiltered row is not a constant"


def test_an_all_greedy_batch_needs_no_generator_and_is_capturable():
    from lockstep.engine.graphs import SampleGraph
    from lockstep.engine.sampling import row_settings
    st = row_settings([SamplingParams(greedy=True)] * 2, [None, None], "cpu")
    assert st.rows is None and st.capturable and not st.filtered and st.unseeded == []
    logits = torch.tensor([[0.0, 2.0, 2.0], [5.0, -1.0, 5.0]])
    tokens, _ = SampleGraph(TORCH_SAMPLER, st, 2, 3, "cpu")(logits, torch.tensor([0, 0]))
    assert tokens.tolist() == [1, 0], "greedy: the first maximum"
