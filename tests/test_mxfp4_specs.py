"""specs/mxfp4/: MXFP4 decoding by known answers (DESIGN §7). Each decoder or loader bug below is
put back by monkeypatching, and the spec named beside it must turn red; a bug the packer and the
decoder share passes a round trip but not these specs."""

import pytest
import torch

import lockstep.engine.checkpoint
import lockstep.engine.mxfp4 as mx
from lockstep.harness import runner
from lockstep.harness.golden import GoldenStore
from lockstep.harness.platform import detect
from lockstep.harness.result import RunContext
from tests.conftest import REPO
from tests.repo_specs import repo_specs

SPECS = {i: s for i, s in repo_specs().items() if i.startswith("mxfp4/")}
CTX = RunContext(detect("cpu"))
STORE = GoldenStore(REPO / "golden")


def status(spec_id):
    return runner.check_spec(SPECS[spec_id], CTX, STORE)


def decoder(*, lut=mx.E2M1_VALUES, swap_nibbles=False, bias=mx.SCALE_BIAS, nan_rule=True, scale_from_bits=False):
    """lockstep.engine.mxfp4.dequantize with one thing changed (the arguments name it)."""
    def dequantize(blocks, scales, dtype=torch.float32):
        table = torch.tensor(lut, dtype=torch.float32)
        lo, hi = table[(blocks & 0x0F).long()], table[(blocks >> 4).long()]
        if swap_nibbles:
            lo, hi = hi, lo
        values = torch.stack([lo, hi], dim=-1).flatten(-2)
        if scale_from_bits:   # 2^(s - 127) built as the float32 with exponent field s: s = 0 gives 0.0
            factor = (scales.to(torch.int32) << 23).view(torch.float32).unsqueeze(-1)
            values = values * factor
        else:
            values = torch.ldexp(values, (scales.to(torch.int32) - bias).unsqueeze(-1).to(torch.float32))
        if nan_rule:
            values = values.masked_fill((scales == 255).unsqueeze(-1), float("nan"))
        return values.flatten(-2).to(dtype)
    return dequantize


def test_the_reference_decoder_is_the_engines(monkeypatch):
    # that every mxfp4 spec passes is its own pytest item's job (pyproject testpaths: specs)
    assert len(SPECS) >= 6
    monkeypatch.setattr(mx, "dequantize", decoder())          # the copy above, unchanged, still passes
    for spec_id in ("mxfp4/e2m1-table", "mxfp4/scale-edges", "mxfp4/scale-255-nan"):
        assert status(spec_id).status == runner.PASS, spec_id


BUGS = {
    "high nibble is the even element": (dict(swap_nibbles=True), ["mxfp4/e2m1-table", "mxfp4/scale-edges"]),
    "sign bit ignored": (dict(lut=mx.E2M1_MAGNITUDES * 2), ["mxfp4/e2m1-table", "mxfp4/scale-edges"]),
    "6 decoded as 5": (dict(lut=(0, .5, 1, 1.5, 2, 3, 4, 5, -0., -.5, -1, -1.5, -2, -3, -4, -5)), ["mxfp4/e2m1-table"]),
    "code 8 decoded as +0.0": (dict(lut=mx.E2M1_MAGNITUDES + (0.0,) + tuple(-m for m in mx.E2M1_MAGNITUDES[1:])),
                               ["mxfp4/e2m1-table"]),
    "scale bias 128": (dict(bias=128), ["mxfp4/e2m1-table", "mxfp4/scale-edges", "mxfp4/scale-edges-bf16"]),
    "scale 255 decoded as 2^128": (dict(nan_rule=False), ["mxfp4/scale-255-nan"]),
    "2^(s-127) from the exponent bits (scale 0 gives 0)": (dict(scale_from_bits=True), ["mxfp4/scale-edges"]),
}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_decoder_bug_turns_the_known_answer_specs_red(monkeypatch, bug):
    change, red = BUGS[bug]
    monkeypatch.setattr(mx, "dequantize", decoder(**change))
    for spec_id in red:
        out = status(spec_id)
        assert out.status in runner.FAILING, (bug, spec_id)
        assert "expectation failed: block " in out.report() and "DESIGN §7 gives" in out.report(), out.report()


def test_the_255_failure_names_block_element_byte_and_code(monkeypatch):
    """Without the NaN rule, 0.5 x 2^(255 - 127) is inf (2^128 overflows fp32); the report says
    which block, element, byte, nibble and code. (0 x 2^128 = 0 x inf is NaN by accident.)"""
    monkeypatch.setattr(mx, "dequantize", decoder(nan_rule=False))
    report = status("mxfp4/scale-255-nan").report()
    assert "block 1 (scale 255), element 1: byte 0 = 0x10, high nibble, code 0x1: decoded inf, " \
           "DESIGN §7 gives nan" in report
    assert "element 0:" not in report


def test_a_bug_shared_by_packer_and_decoder_survives_a_round_trip_but_not_the_specs(monkeypatch):
    """Both sides swap the nibbles: every round trip still holds, the known answers do not."""
    real_quantize = mx.quantize

    def quantize_swapped(values):
        blocks, scales = real_quantize(values)
        return ((blocks & 0x0F) << 4) | (blocks >> 4), scales

    monkeypatch.setattr(mx, "quantize", quantize_swapped)
    monkeypatch.setattr(mx, "dequantize", decoder(swap_nibbles=True))
    x = torch.ldexp(torch.tensor(mx.E2M1_VALUES * 4), torch.tensor(3.0)).reshape(2, 32)
    assert mx.dequantize(*mx.quantize(x)).equal(x)
    assert status("mxfp4/e2m1-table").status in runner.FAILING


def test_a_loader_without_the_255_refusal_turns_the_checkpoint_spec_red(monkeypatch):
    monkeypatch.setattr(lockstep.engine.checkpoint, "refuse_nan_scales", lambda name, scales: None)
    out = status("mxfp4/checkpoint-scale-255-refused")
    assert out.status in runner.FAILING
    assert "the checkpoint loaded; the spec expects it refused" in out.report()


def test_a_loader_refusing_legal_edge_scales_turns_the_control_spec_red(monkeypatch):
    real = lockstep.engine.checkpoint.refuse_nan_scales

    def refuse_254_too(name, scales):
        real(name, torch.where(scales >= 254, torch.full_like(scales, 255), scales))

    monkeypatch.setattr(lockstep.engine.checkpoint, "refuse_nan_scales", refuse_254_too)
    assert status("mxfp4/checkpoint-scale-edges-load").status in runner.FAILING
    assert status("mxfp4/checkpoint-scale-255-refused").status == runner.PASS


def errors_of(text):
    from lockstep.harness.specfile import SpecErrors, parse_spec
    with pytest.raises(SpecErrors) as e:
        parse_spec(text, "specs/mxfp4/bad.yaml", "mxfp4/bad")
    return [str(x) for x in e.value.errors]


def test_spec_errors_are_located():
    head = "kind: mxfp4\ndescription: d\ninputs:\n  blocks:\n"
    errs = errors_of(head + "    - {bytes: [1, 2, 3], scale: 256}\nexpect:\n  values: [[0]]\n")
    assert errs == [
        "specs/mxfp4/bad.yaml:5:15: inputs.blocks[0].bytes: expected a list with 16..16 items, found 3 items",
        "specs/mxfp4/bad.yaml:5:33: inputs.blocks[0].scale: expected an integer >= 0 and <= 255, found int 256",
        "specs/mxfp4/bad.yaml:7:12: expect.values[0]: expected a list with 32..32 items, found 1 items"]
    block = "    - {bytes: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], scale: 127}\n  dtype: bf16\n"
    values = ("expect:\n  values:\n    - [0.1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,\n"
              "       0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, {}]\n")
    assert errors_of(head + block + values.format("'x1p3'")) == [
        "specs/mxfp4/bad.yaml:10:53: expect.values[0][31]: expected a number, .nan, .inf, -.inf or a hex float "
        "such as '0x1.8p-126', found str 'x1p3'"]
    assert errors_of(head + block + values.format("0x1p-133")) == [
        "specs/mxfp4/bad.yaml:9:8: expect.values[0][0]: 0.1 is not exactly representable in bf16"]
    errs = errors_of("kind: mxfp4\ndescription: d\ninputs:\n  checkpoint: {preset: tiny}\n  set_scales:\n"
                     "    - {tensor: model.layers.9.mlp.experts.down_proj_scales, index: [0, 0, 0], value: 255}\n"
                     "    - {tensor: model.layers.0.mlp.experts.down_proj_scales, index: [4, 0, 0], value: 255}\n"
                     "expect:\n  error: [x]\n")
    assert errs == [
        "specs/mxfp4/bad.yaml:6:16: inputs.set_scales[0].tensor: not an MXFP4 scales tensor of preset tiny "
        "(e.g. model.layers.0.mlp.experts.gate_up_proj_scales)",
        "specs/mxfp4/bad.yaml:7:68: inputs.set_scales[1].index: not an index of "
        "model.layers.0.mlp.experts.down_proj_scales, shape [4, 96, 2]"]
