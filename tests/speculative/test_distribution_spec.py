"""The `distribution` kind: its chi-square test by hand, and the rejection spec under a verifier
that ignores q (fails, naming the p-value; under the engine's verifier it passes as its own spec
item)."""

from pathlib import Path

import pytest
import torch

from lockstep.engine import spec_accept, spec_round
from lockstep.harness.kinds import distribution
from lockstep.engine.sampling import SamplingParams
from lockstep.harness.checkpoints import model_for
from lockstep.harness.kinds.distribution import chi_square, exact_law
from lockstep.harness.platform import detect
from lockstep.harness.result import RunContext
from lockstep.harness.specfile import load_spec_file

from tests.speculative.verify_bugs import rejection
from lockstep.harness.targets.lockstep import engine

SPECS = Path(__file__).resolve().parents[2] / "specs"
REJECTION_SPEC = SPECS / "speculative" / "rejection-distribution.yaml"


# ---------------------------------------------------------------------- the test statistic by hand
def test_chi_square_without_pooling():
    # n = 100, expected 50 30 15 5 (all >= 5), observed 40 35 20 5:
    # X² = 100/50 + 25/30 + 25/15 + 0 = 2 + 5/6 + 5/3 = 4.5; df = 3;
    # Q(3/2, 2.25) = erfc(1.5) + 2 sqrt(2.25 / pi) e^-2.25 = 0.0338949 + 0.1783954 = 0.2122903
    t = chi_square(torch.tensor([40, 35, 20, 5]), torch.tensor([.5, .3, .15, .05], dtype=torch.float64), 5)
    assert (t.bins, t.df, t.pooled_expected) == (4, 3, 0.0)
    assert t.statistic == pytest.approx(4.5, abs=1e-12)
    assert t.p_value == pytest.approx(0.2122903, abs=1e-6)


def test_chi_square_pools_low_bins():
    # expected 60 30 4 3 2 1 (n = 100): 4, 3, 2, 1 are below 5 and pooled (10 >= 5, a bin of its own).
    # observed 55 35 (4+2+3+1 = 10): X² = 25/60 + 25/30 + 0 = 1.25, df = 2, p = e^(-1.25/2) = 0.535261
    law = torch.tensor([.60, .30, .04, .03, .02, .01], dtype=torch.float64)
    t = chi_square(torch.tensor([55, 35, 4, 2, 3, 1]), law, 5)
    assert (t.bins, t.df) == (3, 2) and t.pooled_expected == pytest.approx(10.0)
    assert t.statistic == pytest.approx(1.25, abs=1e-12) and t.p_value == pytest.approx(0.535261, abs=1e-6)


def test_a_small_pooled_bin_joins_the_smallest_kept_bin():
    # expected 60 30 6 4: the pooled bin (4) is below 5 and joins the smallest kept bin (6) -> 60 30 10.
    # observed 55 35 6 4 -> 55 35 10: X² = 1.25 again, df = 2
    law = torch.tensor([.60, .30, .06, .04], dtype=torch.float64)
    t = chi_square(torch.tensor([55, 35, 6, 4]), law, 5)
    assert (t.bins, t.df) == (3, 2) and t.statistic == pytest.approx(1.25, abs=1e-12)


def test_an_impossible_sequence_fails_outright():
    t = chi_square(torch.tensor([[50, 0], [49, 1]]), torch.tensor([[.5, 0], [.5, 0]], dtype=torch.float64), 5)
    assert t.impossible == [((1, 1), 1)] and t.p_value == 0.0


def test_too_few_requests_is_an_error():
    with pytest.raises(ValueError, match="at least 2 bins"):
        chi_square(torch.tensor([3, 0]), torch.tensor([.5, .5], dtype=torch.float64), 5)


# ---------------------------------------------------------------------- the exact law
def test_the_exact_law_applies_temperature_and_filters_per_prefix():
    """top_k 2 at temperature 0.5: the law of (t1, t2) sums to 1, every prefix keeps exactly two next
    tokens, and the law of t1 is the top-2 softmax of the prompt's last logits / 0.5."""
    model = model_for({"preset": "tiny-vocab8", "seed": 0, "format": "bf16"})
    law = exact_law(model, [1, 2, 3], SamplingParams(temperature=0.5, top_k=2), 2)
    assert law.shape == (8, 8) and float(law.sum()) == pytest.approx(1.0, abs=1e-12)
    first = law.sum(dim=1)
    assert int((first > 0).sum()) == 2
    assert all(int((law[t] > 0).sum()) == 2 for t in range(8) if first[t] > 0)
    logits = model.forward(torch.tensor([1, 2, 3]), torch.arange(3), torch.zeros(3, dtype=torch.int64),
                           model.new_cache(1, 3)).logits[-1].to(torch.float64) / 0.5
    top2 = torch.topk(logits, 2).indices
    want = torch.zeros(8, dtype=torch.float64)
    want[top2] = torch.softmax(logits[top2], dim=0)
    assert torch.allclose(first, want, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------- the spec, honest and biased
def run_spec():
    spec, ctx = load_spec_file(REJECTION_SPEC, SPECS), RunContext(detect("cpu"))
    with torch.inference_mode():
        result = distribution.run(spec, ctx, engine(ctx))
    return spec, result, distribution.check(spec, result)


# The engine's verifier passing this spec (p-value above alpha, acceptance in 20-80% of the rounds)
# is the spec item itself: specs/speculative/rejection-distribution.yaml runs as a pytest item
# (`speculative/rejection-distribution[cpu-fp32]`, and cpu-bf16), the same run and check plus its
# golden's counts, so no test here runs it a second time (docs/history/gate.md, "Measured by tests5").


def test_a_verifier_ignoring_q_fails_the_spec(monkeypatch):
    # planted in the acceptance the batched round runs (engine.spec_round's _accept_rejection): u < p(x)
    def ignoring_q(tokens, children, p, q, coins):
        kid = children[:, :, 0].clamp(min=0)
        x = tokens.gather(1, kid)
        px = p.gather(2, x[:, :, None])[:, :, 0]
        return torch.where((children[:, :, 0] >= 0) & (coins.to(torch.float64) < px), kid, -1)
    monkeypatch.setattr(spec_round, "_accept_rejection", ignoring_q)       # the round's
    monkeypatch.setattr(spec_accept, "_accept_rejection", ignoring_q)      # verify_rejection's
    spec, result, fails = run_spec()
    d = result.data
    print(f"biased verifier: X² = {d['statistic']:.2f}, df = {d['df']}, p = {d['p_value']:.4g}, "
          f"acceptance rate {d['acceptance_rate']:.3f}")
    assert d["p_value"] < 1e-20
    chi, *others = fails
    assert chi.startswith("chi-square goodness of fit: X² = ")
    assert f"p-value {d['p_value']:.3g} <= alpha 0.001" in chi
    assert "do not follow the target's sampling distribution" in chi
    # Accepting on u < p(x) also accepts less often (about 11% of rounds instead of 35%), which the
    # acceptance bound reports on its own; the chi-square failure above does not depend on it.
    assert all(m.startswith("acceptance rate ") for m in others), others
