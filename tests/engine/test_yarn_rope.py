import math

import pytest
import torch

from lockstep.engine.config import RopeParams, preset
from lockstep.engine.rope import rope_frequencies
from lockstep.kernels.rope import apply_rope_portable as apply_rope


def openai_reference_inv_freq(head_dim, theta, factor, ctx, alpha, beta):
    """The formula of the openai gpt-oss reference (reference notes §1.4), written out in float64."""
    d_half = head_dim / 2
    low = d_half * math.log(ctx / (beta * 2 * math.pi)) / math.log(theta)
    high = d_half * math.log(ctx / (alpha * 2 * math.pi)) / math.log(theta)
    out = []
    for i in range(head_dim // 2):
        freq = theta ** (2 * i / head_dim)
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        mask = 1 - ramp
        out.append(1 / (factor * freq) * (1 - mask) + 1 / freq * mask)
    return torch.tensor(out, dtype=torch.float64), low, high


def test_gpt_oss_yarn_constants():
    c = preset("gpt-oss-20b")
    inv_freq, mscale = rope_frequencies(c.head_dim, c.rope)
    ref, low, high = openai_reference_inv_freq(64, 150000.0, 32.0, 4096, 1.0, 32.0)
    assert low == pytest.approx(8.0928, abs=1e-4) and high == pytest.approx(17.3980, abs=1e-4)
    assert mscale == pytest.approx(1.346574, abs=1e-6)
    assert mscale ** 2 == pytest.approx(1.81326, abs=1e-5)
    assert inv_freq.dtype == torch.float32 and inv_freq.shape == (32,)
    assert torch.allclose(inv_freq.double(), ref, rtol=2e-6, atol=0)
    # dims below `low` keep the original frequency, dims above `high` are divided by the factor
    base = 150000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    assert torch.allclose(inv_freq[:8].double(), base[:8], rtol=2e-6)
    assert torch.allclose(inv_freq[18:].double(), base[18:] / 32, rtol=2e-6)


@pytest.mark.parametrize("name", ["tiny", "tiny-d24", "small"])
def test_small_presets_ramp_stays_inside_the_head(name):
    """With low, high in [0, d-1] HF's clamp is a no-op, so both reference formulas agree."""
    c = preset(name)
    inv_freq, mscale = rope_frequencies(c.head_dim, c.rope)
    ref, low, high = openai_reference_inv_freq(c.head_dim, c.rope.theta, c.rope.factor,
                                               c.rope.original_max_position_embeddings, 1.0, 32.0)
    assert 0 < low < high < c.head_dim - 1
    assert torch.allclose(inv_freq.double(), ref, rtol=2e-6)
    assert mscale == pytest.approx(0.1 * math.log(32) + 1)


def test_default_rope_has_no_scaling():
    inv_freq, mscale = rope_frequencies(8, RopeParams(rope_type="default", theta=10000.0))
    assert mscale == 1.0
    assert torch.allclose(inv_freq, torch.tensor([1.0, 0.1, 0.01, 0.001]))


def test_half_split_rotation():
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])                       # pairs (1, 3) and (2, 4)
    a = torch.tensor([[0.3, 1.1]])
    out = apply_rope(x, a.cos(), a.sin())[0, 0]
    c, s = a[0].cos(), a[0].sin()
    assert torch.allclose(out, torch.stack([1 * c[0] - 3 * s[0], 2 * c[1] - 4 * s[1],
                                            3 * c[0] + 1 * s[0], 4 * c[1] + 2 * s[1]]))
