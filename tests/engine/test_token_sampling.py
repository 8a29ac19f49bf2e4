import math

import pytest
import torch

from lockstep.engine.sampling import SamplingParams, chosen_logprob, keep_mask, sample, seed_as_int64
from lockstep.kernels.coins import SAMPLE_COLUMNS, gumbel_noise, murmur_hash32_torch


def test_coin_module_known_answer():
    h = murmur_hash32_torch(torch.tensor([42]), torch.tensor([123]), torch.tensor([2]))
    assert h.item() == 2740678348


def test_greedy_is_first_maximum():
    logits = torch.tensor([0.5, 2.0, -1.0, 2.0, 2.0])
    assert sample(logits, SamplingParams(greedy=True), None, 0) == 1
    assert sample(logits, SamplingParams(temperature=0.0), 123, 7) == 1


def test_seeded_gumbel_max_by_hand():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, generator=g) * 2
    for seed, pos, temp in ((7, 0, 1.0), (7, 1, 1.0), (-3, 40, 0.7), (2**64 - 1, 5, 1.3)):
        z = logits.double() / temp
        logp = torch.log_softmax(z, -1)
        noise = gumbel_noise(torch.tensor([seed_as_int64(seed)]), torch.tensor([pos]),
                             SAMPLE_COLUMNS + torch.arange(64))[0]
        expect = int(torch.argmax(logp + noise))
        assert sample(logits, SamplingParams(temperature=temp), seed, pos) == expect
    assert seed_as_int64(2**64 - 1) == -1


def test_seed_and_position_change_the_draw():
    logits = torch.zeros(1000)                       # uniform: the draw is the noise argmax
    draws = {sample(logits, SamplingParams(), s, p) for s in range(4) for p in range(4)}
    assert len(draws) >= 14
    assert sample(logits, SamplingParams(), 9, 9) == sample(logits, SamplingParams(), 9, 9)


def test_gumbel_max_follows_the_distribution():
    probs = torch.tensor([0.5, 0.25, 0.125, 0.125])
    logits = probs.log()
    counts = torch.zeros(4)
    n = 4000
    for pos in range(n):
        counts[sample(logits, SamplingParams(), 11, pos)] += 1
    assert torch.allclose(counts / n, probs, atol=0.03)


def test_masks_are_excluded():
    logits = torch.tensor([3.0, 2.9, 2.8, -5.0, 1.0])
    for pos in range(200):
        assert sample(logits, SamplingParams(top_k=2), 1, pos) in (0, 1)
        assert sample(logits, SamplingParams(min_p=0.5), 1, pos) in (0, 1, 2)


def test_keep_mask_rules():
    z = torch.tensor([1.0, 3.0, 3.0, 2.0, 0.0], dtype=torch.float64)
    keep = lambda **kw: keep_mask(z, kw.get("top_k", 0), kw.get("top_p", 1.0), kw.get("min_p", 0.0)).tolist()  # noqa
    assert keep() == [True] * 5
    assert keep(top_k=1) == [False, True, False, False, False]            # tie at the cut: lower id
    assert keep(top_k=2) == [False, True, True, False, False]
    p = torch.softmax(z, -1)
    # top_p: rank order 1, 2, 3, 0, 4; keep a rank while the mass before it is < top_p
    assert keep(top_p=float(p[1]) * 0.5) == [False, True, False, False, False]
    assert keep(top_p=float(p[1])) == [False, True, False, False, False]    # mass before id 2 == top_p
    assert keep(top_p=float(p[1]) + 1e-9) == [False, True, True, False, False]
    assert keep(top_p=0.98) == [True, True, True, True, False]      # mass before id 4 is 0.9805
    ratio = float(p[3] / p[1])
    assert keep(min_p=ratio) == [False, True, True, True, False]           # p >= min_p * max(p)
    assert keep(min_p=ratio + 1e-6) == [False, True, True, False, False]
    assert keep(top_k=3, min_p=ratio * 0.1, top_p=0.9) == [False, True, True, True, False]


def test_unseeded_uses_the_explicit_generator():
    logits = torch.zeros(500)
    a = [sample(logits, SamplingParams(), None, 0, torch.Generator().manual_seed(5)) for _ in range(2)]
    assert a[0] == a[1]
    with pytest.raises(ValueError, match="Generator"):
        sample(logits, SamplingParams(), None, 0, None)


def test_chosen_logprob():
    logits = torch.tensor([1.0, 2.0, 3.0])
    lp = chosen_logprob(logits, 2)
    assert lp.dtype == torch.float32
    assert lp.item() == pytest.approx(3 - math.log(math.exp(1) + math.exp(2) + math.exp(3)), abs=1e-6)


@pytest.mark.parametrize("kw, field", [
    (dict(temperature=-0.1), "temperature"), (dict(temperature=float("nan")), "temperature"),
    (dict(top_k=-1), "top_k"), (dict(top_k=1.5), "top_k"),
    (dict(top_p=0.0), "top_p"), (dict(top_p=1.01), "top_p"),
    (dict(min_p=-0.1), "min_p"), (dict(min_p=1.5), "min_p"),
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(greedy=1), "greedy"),
    (dict(stop_token_ids=(-1,)), "stop_token_ids"),
])
def test_params_validation_names_the_field(kw, field):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field}"):
        SamplingParams(**kw)
