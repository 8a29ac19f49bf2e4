import pytest
import torch

from lockstep.engine import mxfp4


def test_hand_worked_block():
    # byte 0x21: low nibble 1 -> element 0 = +0.5, high nibble 2 -> element 1 = +1.0
    # byte 0xF8: low nibble 8 -> element 2 = -0.0, high nibble F -> element 3 = -6.0
    # byte 0x7B: low nibble B -> element 4 = -1.5, high nibble 7 -> element 5 = +6.0
    # scale 129 -> every value x 2^(129 - 127) = x 4
    blocks = torch.zeros(1, 16, dtype=torch.uint8)
    blocks[0, :3] = torch.tensor([0x21, 0xF8, 0x7B], dtype=torch.uint8)
    scales = torch.tensor([129], dtype=torch.uint8)
    out = mxfp4.dequantize(blocks, scales)
    assert out.shape == (32,)
    assert out[:6].tolist() == [2.0, 4.0, -0.0, -24.0, -6.0, 24.0]
    assert torch.signbit(out[2])
    assert out[6:].abs().sum() == 0
    # scale 127 is x1, scale 0 is x2^-127 (still exact in fp32 as a subnormal)
    assert mxfp4.dequantize(blocks, torch.tensor([127], dtype=torch.uint8))[:2].tolist() == [0.5, 1.0]
    assert mxfp4.dequantize(blocks, torch.tensor([0], dtype=torch.uint8))[1].item() == 2.0 ** -127


def test_every_code_decodes_to_the_e2m1_table():
    codes = torch.arange(16, dtype=torch.uint8)
    blocks = (codes | (codes << 4)).reshape(1, 16)          # byte b holds code b twice
    out = mxfp4.dequantize(blocks, torch.tensor([127], dtype=torch.uint8))
    assert out[0::2].tolist() == list(mxfp4.E2M1_VALUES)
    assert out[1::2].tolist() == list(mxfp4.E2M1_VALUES)


def test_shapes_like_the_20b_layout():
    E, rows, K = 2, 6, 2880
    blocks = torch.randint(0, 256, (E, rows, K // 32, 16), dtype=torch.uint8)
    scales = torch.randint(118, 130, (E, rows, K // 32), dtype=torch.uint8)
    assert mxfp4.dequantize(blocks, scales).shape == (E, rows, K)
    assert mxfp4.dequantize(blocks, scales, torch.bfloat16).float().equal(mxfp4.dequantize(blocks, scales))


def test_grid_values_round_trip_exactly():
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (3, 5, 64), generator=g)
    codes[..., ::32] = 7                                   # each block holds a +6 -> scale is determined
    exps = torch.randint(-10, 5, (3, 5, 2, 1), generator=g).float()
    lut = torch.tensor(mxfp4.E2M1_VALUES)
    x = torch.ldexp(lut[codes].reshape(3, 5, 2, 32), exps).reshape(3, 5, 64)
    blocks, scales = mxfp4.quantize(x)
    assert blocks.shape == (3, 5, 2, 16) and scales.shape == (3, 5, 2)
    assert scales.long().sub(127).eq(exps.squeeze(-1).long()).all()
    assert mxfp4.dequantize(blocks, scales).equal(x)


def test_random_values_error_bound_and_idempotence():
    x = torch.randn(4, 8, 96, generator=torch.Generator().manual_seed(2))
    blocks, scales = mxfp4.quantize(x)
    dq = mxfp4.dequantize(blocks, scales)
    step = torch.ldexp(torch.ones(4, 8, 3, 1), scales.long().sub(127).unsqueeze(-1).float())
    # the widest gap of the grid is 4 -> 6, so the error is at most 1 * 2^e
    assert ((x - dq).reshape(4, 8, 3, 32).abs() <= step).all()
    # grid values survive a second round trip (the bytes may differ: a block whose largest
    # value rounded down to 3 * 2^e is re-encoded as 6 * 2^(e-1))
    assert mxfp4.dequantize(*mxfp4.quantize(dq)).equal(dq)


def test_ties_go_to_the_even_code():
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    x = torch.zeros(32)
    x[:8] = mids
    x[8:16] = -mids
    blocks, scales = mxfp4.quantize(x)
    assert scales.item() == 127
    dq = mxfp4.dequantize(blocks, scales)
    assert dq[:8].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0]
    assert dq[8:16].tolist() == [-0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0, -6.0]


def test_zero_block_and_bad_input():
    blocks, scales = mxfp4.quantize(torch.zeros(2, 32))
    assert blocks.eq(0).all() and mxfp4.dequantize(blocks, scales).eq(0).all()
    with pytest.raises(ValueError, match="multiple of 32"):
        mxfp4.quantize(torch.zeros(2, 33))
    with pytest.raises(ValueError, match="uint8"):
        mxfp4.dequantize(torch.zeros(1, 16), torch.zeros(1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="shapes disagree"):
        mxfp4.dequantize(torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(3, dtype=torch.uint8))


def test_quantize_scales_by_an_exact_power_of_two_as_ldexp_does():
    """quantize multiplies a block by 2^-e built from its bits (torch.ldexp on CUDA multiplies by
    pow(2, e), not exact for every e): on the CPU the codes are ldexp's at every shared exponent,
    the subnormal 2^-127 and 2^127 included."""
    from lockstep.kernels import mxfp4 as formats
    g = torch.Generator().manual_seed(5)
    base = torch.randn(256, 32, generator=g)
    for e in range(-127, 128, 3):
        x = torch.ldexp(base, torch.tensor(float(e))).clamp(-3e38, 3e38)      # blocks at many exponents
        blocks, scales = formats.quantize(x)
        amax = x.abs().amax(-1, keepdim=True)                                 # [256, 1]: one block a row
        mant, p = torch.frexp(amax / 6.0)
        want_e = torch.where(mant == 0.5, p - 1, p).clamp(-127, 127)
        scaled = torch.ldexp(x, (-want_e).to(torch.float32))
        assert torch.equal(scaled, torch.mul(x, formats._power_of_two((127 - want_e).to(torch.uint8))))
        assert torch.equal(scales.to(torch.int32) - 127, want_e.to(torch.int32))
