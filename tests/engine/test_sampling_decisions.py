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
    assert sampling.FUSED_SAMPLER.sample(logits, settings, torch.tensor(positions))[0].tolist() == tokens.tolist(), \
        "the fused sampler without fused settings: the torch path"
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


def test_an_unseeded_row_draws_its_noise_from_the_generator():
    """V integers in [0, 2^32) from the generator, hashed to Gumbel noise like a seeded row's."""
    from lockstep.kernels.coins import gumbel_from_hash

    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(3))
    settings = sampling.row_settings([SamplingParams(temperature=0.7)], [None], "cpu")
    for seed in range(5, 25):          # a token is one draw: several generators, so a changed range shows
        h = torch.randint(0, 1 << 32, (V,), dtype=torch.int64, generator=torch.Generator().manual_seed(seed))
        want = (portable.log_softmax(logits[0].double() / 0.7, dim=-1) + gumbel_from_hash(h)).argmax()
        got = sampling.sample_with(logits, settings, torch.tensor([0]), torch.Generator().manual_seed(seed))
        assert got.tolist() == [int(want)], seed


def test_the_fused_operands_of_a_batch():
    """RowSettings.fused (the fused kernel's per-row operands; the CPU samples on the torch path):
    mode, temperature, seed and the row's index among the sampled ones, or None when a sampled
    row has no seed."""
    from lockstep.engine.request import seed_as_int64
    from lockstep.kernels.sampling import GREEDY, SEEDED, fused_temperature

    params = [SamplingParams(temperature=0.5, greedy=True), SamplingParams(temperature=0.5),
              SamplingParams(temperature=2.0, top_k=3)]
    s = sampling.row_settings(params, [None, 7, -9], "cpu")
    modes, temps, seeds, keep_idx = s.fused
    assert modes.dtype == torch.int32 and modes.tolist() == [GREEDY, SEEDED, SEEDED]
    assert temps.dtype == torch.float64 and temps.tolist() == [1.0, fused_temperature(0.5, "cpu"),
                                                                fused_temperature(2.0, "cpu")]
    assert seeds.tolist() == [0, seed_as_int64(7), seed_as_int64(-9)] and keep_idx.tolist() == [-1, 0, 1]
    greedy = sampling.row_settings([SamplingParams(greedy=True)] * 2, [None, 3], "cpu")
    assert [t.tolist() for t in greedy.fused] == [[GREEDY, GREEDY], [1.0, 1.0], [0, 0], [-1, -1]]
    assert (greedy.rows, greedy.temperatures, greedy.unseeded, greedy.filtered) == (None, [], [], False)
    assert sampling.row_settings(params, [None, 7, None], "cpu").fused is None


def test_only_the_filters_a_row_uses_are_built():
    """top_k, top_p, min_p are None where no row uses them (`filtered` then False: no mask at all),
    and the seeded rows' tensors None when no row is seeded."""
    plain = sampling.row_settings([SamplingParams(temperature=0.5), SamplingParams()], [None, None], "cpu")
    assert (plain.top_k, plain.top_p, plain.min_p, plain.filtered) == (None, None, None, False)
    assert (plain.seeded, plain.seeded_rows, plain.seeds, plain.unseeded) == (None, None, None, [0, 1])
    one = sampling.row_settings([SamplingParams(top_p=0.9), SamplingParams()], [1, 2], "cpu")
    assert (one.top_k, one.min_p) == (None, None) and one.top_p.tolist() == [[0.9, 1.0], [0.0, 1.0]]


def test_which_path_samples(monkeypatch):
    """The fused sampler takes the fused kernel when the batch has its operands, the torch path
    otherwise; the torch sampler never does; the ops table picks the sampler once, by backend and
    device. A recorder stands in for the kernel."""
    from lockstep.engine.ops import ops_for
    calls = []

    def fused(logits, settings, positions):
        calls.append((logits, settings, positions))
        return torch.full((logits.shape[0],), 99), None
    monkeypatch.setattr(sampling, "sample_fused", fused)
    logits, positions = torch.randn(2, V), torch.tensor([4, 5])
    seeded = sampling.row_settings([SamplingParams(), SamplingParams(greedy=True)], [1, None], "cpu")
    assert sampling.FUSED_SAMPLER.sample(logits, seeded, positions)[0].tolist() == [99, 99]
    assert calls == [(logits, seeded, positions)]
    assert sampling.TORCH_SAMPLER.sample(logits, seeded, positions)[0].tolist() != [99, 99]
    unseeded = sampling.row_settings([SamplingParams(), SamplingParams()], [1, None], "cpu")
    got = sampling.FUSED_SAMPLER.sample(logits, unseeded, positions, torch.Generator().manual_seed(0))[0]
    assert got.tolist() != [99, 99] and len(calls) == 1, "no fused operands: the torch path"
    assert sampling.sample_rows(logits, [SamplingParams()] * 2, [1, 2], [4, 5]).tolist() != [99, 99]
    assert sampling.sample_rows(logits, [SamplingParams()] * 2, [1, 2], [4, 5],
                                sampler=sampling.FUSED_SAMPLER).tolist() == [99, 99]
    chosen = {(b, d): ops_for(b, d).sampler for b in ("torch", "triton", "fast") for d in ("cpu", "cuda")}
    assert chosen == {("torch", "cpu"): sampling.TORCH_SAMPLER, ("torch", "cuda"): sampling.TORCH_SAMPLER,
                      ("triton", "cpu"): sampling.TORCH_SAMPLER, ("triton", "cuda"): sampling.FUSED_SAMPLER,
                      ("fast", "cpu"): sampling.TORCH_SAMPLER, ("fast", "cuda"): sampling.FUSED_SAMPLER}


def test_the_decision_scores_are_made_on_the_logits_device():
    settings = sampling.row_settings(PARAMS[:3], [1, None, 2], "meta")
    scores = sampling.decision_scores(torch.empty(3, V, device="meta"), settings,
                                      torch.zeros(3, dtype=torch.int64, device="meta"))
    assert scores.shape == (3, V) and scores.device.type == "meta" and scores.dtype == torch.float64
