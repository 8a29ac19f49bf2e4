"""inverse_cdf_rows, the host draw every sampled round ends with (engine/speculative.py, DESIGN §5):
a strict `>` against coin x total, in float64 whatever the inputs' dtype, per row, and the
fallback to the last non-zero weight when an infinite weight leaves no running sum above the
threshold. Each case is one where a near variant of the rule gives another index."""

from __future__ import annotations

import math

import pytest
import torch

from lockstep.engine.speculative import inverse_cdf, inverse_cdf_rows


def rows(*r, dtype=torch.float64):
    return torch.tensor(r, dtype=dtype)


def test_the_running_sum_must_exceed_the_threshold():
    assert inverse_cdf(rows(1.0, 1.0), 0.5) == 1             # 1 is not > 0.5 * 2


def test_the_sums_are_float64_whatever_the_weights_dtype():
    """[2^24, 1, 1] in float32 sums to 2^24 at every step; in float64 the ones count."""
    w = rows([2.0 ** 24, 1.0, 1.0], dtype=torch.float32)
    assert inverse_cdf_rows(w, rows(0.9999999)) == [1]
    assert inverse_cdf(w[0], 0.9999999) == 1


def test_the_coin_is_taken_in_float64():
    """0.99999995 in float32 is 0.99999994: the threshold moves below 2^24 + 1."""
    assert inverse_cdf(rows(2.0 ** 24, 1.0, 1.0), 0.99999995) == 2


def test_an_infinite_weight_falls_back_to_the_last_non_zero_one_per_row():
    w = rows([math.inf, 0.0, 0.0], [1.0, math.inf, 0.0])
    assert inverse_cdf_rows(w, rows(0.5, 0.5)) == [0, 1]


def test_refusals_name_the_rule():
    with pytest.raises(ValueError, match=r"^inverse_cdf_rows: all weights are zero$"):
        inverse_cdf_rows(rows([1.0, 0.0], [0.0, 0.0]), rows(0.5, 0.5))
    with pytest.raises(ValueError, match=r"^inverse_cdf_rows: the running sums are taken on the CPU \(DESIGN §5\)$"):
        inverse_cdf_rows(torch.ones(1, 2, dtype=torch.float64, device="meta"), rows(0.5))
