"""The torch sampling path's decision, written out independently: a seeded row's scores are
log_softmax(z / t, masked) + Gumbel noise of (seed, position, SAMPLE_COLUMNS + id), a greedy row's
its logits; the token is their first maximum. Ties at a filter's cut go to the lower ids (a
stable sort). Tensors are made on the logits' device (shown on "meta", as a CUDA run would)."""

from __future__ import annotations

import pytest
import torch

from lockstep.engine import sampling
from lockstep.engine.request import SamplingParams
from lockstep.kernels import portable
from lockstep.kernels.coins import SAMPLE_COLUMNS, gumbel_noise

V = 12


def _scores(logits, params, seeds, positions):
    """The scores each row decides by, from the definitions (module docstring of engine.sampling)."""
    out = logits.to(torch.float64).clone()
    for r, p in enumerate(params):
        if p.is_greedy:
            continue
        z = logits[r].to(torch.float64) / p.temperature
        keep = sampling.keep_mask(z, p.top_k, p.top_p, p.min_p)
        z = torch.where(keep, z, float("-inf"))
        noise = gumbel_noise(torch.tensor([seeds[r]]), torch.tensor([positions[r]]),
                             SAMPLE_COLUMNS + torch.arange(V))[0]
        out[r] = portable.log_softmax(z, dim=-1) + noise
    return out


PARAMS = [SamplingParams(temperature=0.5), SamplingParams(greedy=True), SamplingParams(temperature=2.0, top_k=3),
          SamplingParams(temperature=0.5, top_p=0.6), SamplingParams(temperature=1.0, min_p=0.2),
          SamplingParams(temperature=2.0)]


def test_the_decision_scores_and_tokens_follow_the_definition():
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(len(PARAMS), V, generator=g) * 3
    seeds, positions = [11, None, 12, 13, 14, 15], [3, 4, 5, 6, 7, 8]
    settings = sampling.row_settings(PARAMS, seeds, "cpu")
    want = _scores(logits, PARAMS, seeds, positions)
    got = sampling.decision_scores(logits, settings, torch.tensor(positions))
    assert got.dtype == torch.float64 and torch.equal(got, want)
    tokens = sampling.sample_with(logits, settings, torch.tensor(positions))
    assert tokens.tolist() == want.argmax(-1).tolist()
    assert sampling.sample_with(logits, settings, torch.tensor(positions), fused=True).tolist() == tokens.tolist(), \
        "fused asked for without fused settings: the torch path"
    greedy = sampling.row_settings([SamplingParams(greedy=True)] * 2, [None, None], "cpu")
    assert torch.equal(sampling.decision_scores(logits[:2], greedy, torch.tensor([0, 0])), logits[:2].double())


def test_a_temperature_divides_the_logits():
    """t = 0.5 doubles the gaps: the scores are log_softmax(2 z) + noise, not log_softmax(z / 2)."""
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0] + [0.0] * (V - 4)])
    settings = sampling.row_settings([SamplingParams(temperature=0.5)], [5], "cpu")
    got = sampling.decision_scores(logits, settings, torch.tensor([0]))
    noise = gumbel_noise(torch.tensor([5]), torch.tensor([0]), SAMPLE_COLUMNS + torch.arange(V))[0]
    assert torch.equal(got[0], portable.log_softmax(logits[0].double() * 2, dim=-1) + noise)


def test_an_unseeded_row_needs_a_generator_and_has_no_decision_scores():
    logits = torch.zeros(1, V)
    settings = sampling.row_settings([SamplingParams()], [None], "cpu")
    with pytest.raises(ValueError) as e:
        sampling.sample_with(logits, settings, torch.tensor([0]))
    assert str(e.value) == "sample: a request without a seed needs an explicit torch.Generator"
    with pytest.raises(ValueError) as e:
        sampling.decision_scores(logits, settings, torch.tensor([0]))
    assert str(e.value) == "decision_scores: a request without a seed has no reproducible scores"


def test_ties_at_a_cut_go_to_the_lower_ids():
    """Equal probabilities rank by id (a stable sort; torch's default sort on the CPU reorders
    equal values past a few dozen)."""
    z = torch.zeros(100, dtype=torch.float64)
    assert sampling.keep_mask(z, 5, 1.0, 0.0).nonzero()[:, 0].tolist() == [0, 1, 2, 3, 4]
    assert sampling.keep_mask(z, 0, 0.05, 0.0).nonzero()[:, 0].tolist() == [0, 1, 2, 3, 4], "5 of 100 reach 0.05"
    rows = sampling.keep_mask_rows(z.expand(2, 100).clone(), torch.tensor([3, 1 << 62]),
                                   torch.tensor([[1.0, 0.02], [1.0, 0.0]], dtype=torch.float64), None)
    assert rows[0].nonzero()[:, 0].tolist() == [0, 1, 2] and rows[1].nonzero()[:, 0].tolist() == [0, 1]


def test_the_masks_are_made_on_the_logits_device():
    """On "meta" (shapes only) a tensor made on the default device is refused when mixed in, as a
    CPU tensor would be in a CUDA run."""
    z = torch.empty(2, V, dtype=torch.float64, device="meta")
    on = torch.ones(2, 2, dtype=torch.float64, device="meta")
    keep = sampling.keep_mask_rows(z, torch.ones(2, dtype=torch.int64, device="meta"), on, on)
    assert keep.shape == (2, V) and keep.device.type == "meta" and keep.dtype == torch.bool
    one = sampling.keep_mask(torch.empty(V, dtype=torch.float64, device="meta"), 2, 0.5, 0.1)
    assert one.shape == (V,) and one.device.type == "meta"
    settings = sampling.row_settings(PARAMS[:3], [1, None, 2], "meta")
    tokens = sampling.sample_with(torch.empty(3, V, device="meta"), settings,
                                  torch.zeros(3, dtype=torch.int64, device="meta"))
    assert tokens.shape == (3,) and tokens.device.type == "meta"
