"""Primitives on dense grids (specs/primitives/): put a realistic bug back into one primitive and the
spec that pins it turns red, where the end-to-end specs round the same way and stay green.

    break                                                      spec that turns red
    exp64 loses its last Taylor term                           primitives/exp64
    exp's range reduction rounds k half-even (torch.round)     primitives/exp64
    log's mantissa reduction switches at 1.5, not sqrt(2)      primitives/log64 (fp32 log rounds it away)
    sincos64's pi/2 loses its third part                       primitives/sincos64
    tree_sum adds left to right                                primitives/tree-sum
    prefix_sum is torch.cumsum (sequential, fp32)              primitives/prefix-sum
    running_sum starts from x[0] (keeps a leading -0.0)        primitives/running-sum
    bf16 stores truncate instead of rounding to nearest even   primitives/to-bf16-triton
    Triton exp takes numpy's exp in the interpreter            primitives/exp-triton
    bf16 casts lose the sign of zero                           primitives/to-bf16
"""

import math

import pytest
import torch
import triton
import triton.language as tl

import lockstep.kernels.portable as portable
import lockstep.kernels.primitives
from lockstep.harness.kinds import primitive
from lockstep.harness.targets import lockstep_run
from tests.planted import Planted, module_with

# one xdist worker runs the module (pyproject --dist loadgroup): its clean recordings (tests/planted.py) once a run
pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:overflow encountered",
                                        "ignore:divide by zero encountered"),
              pytest.mark.xdist_group("primitive-specs")]


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    return Planted(tmp_path_factory.mktemp("primitives"), ["primitives/exp-triton", "primitives/to-bf16-triton"])


def test_the_named_specs_pass_clean(specs):
    for spec_id in ("primitives/exp64", "primitives/log", "primitives/tree-sum", "primitives/running-sum",
                    "primitives/exp-triton", "primitives/to-bf16-triton"):
        specs.green(spec_id)


def test_exp64_without_its_last_term(specs, monkeypatch):
    monkeypatch.setattr(portable, "_EXP_COEFFS", portable._EXP_COEFFS[:-1])
    assert "tensor 'y'" in specs.red("primitives/exp64")


def test_exp_reduction_rounding_half_even(specs, monkeypatch, tmp_path):
    """k = round(x / ln 2), ties to even, instead of floor(x / ln 2 + 1/2): another r at the halfway
    points, whose polynomial rounds differently."""
    buggy = module_with(portable, {"torch.floor(torch.add(torch.mul(xc, _INV_LN2), 0.5))":
                                   "torch.round(torch.mul(xc, _INV_LN2))"}, tmp_path)
    monkeypatch.setattr(portable, "exp64", buggy.exp64)
    assert "tensor 'y'" in specs.red("primitives/exp64")


def test_log_reduction_at_the_wrong_point(specs, monkeypatch):
    monkeypatch.setattr(portable, "_SQRT2", 1.5)
    assert "tensor 'y'" in specs.red("primitives/log64")
    specs.green("primitives/log")   # fp32 rounds it away: why the float64 functions have specs of their own


def test_sincos_with_a_short_pi(specs, monkeypatch):
    monkeypatch.setattr(portable, "_PIO2_3", 0.0)
    report = specs.red("primitives/sincos64")
    assert "tensor 'sin'" in report or "tensor 'cos'" in report


def test_tree_sum_left_to_right(specs, monkeypatch):
    def left_to_right(x, dim=-1, keepdim=False):
        acc = x.select(dim, 0).clone()
        for i in range(1, x.shape[dim]):
            acc = torch.add(acc, x.select(dim, i))
        return acc.unsqueeze(dim) if keepdim else acc
    monkeypatch.setattr(portable, "tree_sum", left_to_right)
    report = specs.red("primitives/tree-sum")
    assert "expectation failed: tree_sum (torch, length 3)" in report   # the oracle names the first length


def test_prefix_sum_sequential(specs, monkeypatch):
    monkeypatch.setattr(portable, "prefix_sum", lambda x, dim=-1: torch.cumsum(x, dim))
    assert "not the exact rounding" in specs.red("primitives/prefix-sum")


def test_running_sum_from_the_first_element(specs, monkeypatch):
    """Only the sign of a leading zero changes: -0.0 vs 0.0, which the bitwise comparison sees."""
    def from_first(x):
        x = x.detach().to("cpu", torch.float64)
        out = x.clone()
        for i in range(1, x.numel()):
            out[i] = out[i - 1] + x[i]
        return out
    monkeypatch.setattr(portable, "running_sum", from_first)
    report = specs.red("primitives/running-sum")
    assert "-0.0 (0x8000000000000000)" in report and "0.0 (0x0000000000000000)" in report, report


@triton.jit
def cast_truncating(x, DTYPE: tl.constexpr):
    """cast_rne without the rounding: the top 16 bits (what Triton's interpreter itself does)."""
    if DTYPE == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(DTYPE)


def test_bf16_store_truncating(specs, monkeypatch):
    monkeypatch.setattr(lockstep.kernels.primitives, "cast_rne", cast_truncating)
    report = specs.red("primitives/to-bf16-triton")
    assert "not the exact rounding" in report and "differ from the torch implementation" in report


@triton.jit
def exp_numpy(x, PORTABLE: tl.constexpr):
    return tl.exp(x)


def test_triton_exp_not_portable(specs, monkeypatch):
    monkeypatch.setattr(lockstep.kernels.primitives, "exp_f32", exp_numpy)
    report = specs.red("primitives/exp-triton")
    assert "differ from the torch implementation" in report or "tensor 'y'" in report


def test_bf16_cast_losing_the_sign_of_zero(specs, monkeypatch):
    real = lockstep_run.torch_impl

    def unsigned_zero(fn, x):
        y = real(fn, x)
        return torch.where(y == 0, torch.zeros_like(y), y) if fn == "to_bf16" else y
    monkeypatch.setattr(lockstep_run, "torch_impl", unsigned_zero)
    report = specs.red("primitives/to-bf16")
    assert "not the exact rounding" in report and "0x8000" in report


def test_exact_rounding_oracle_known_answers():
    """The oracle itself, on values whose rounding is worked out by hand."""
    r = primitive.round_to
    assert r([1.0 + 2.0 ** -8], torch.bfloat16) == [0x3F80]            # halfway, even kept bit: down
    assert r([1.0 + 3 * 2.0 ** -8], torch.bfloat16) == [0x3F82]        # halfway, odd kept bit: up
    assert r([-0.0, math.inf, 2.0 ** -149], torch.float32) == [0x80000000, 0x7F800000, 0x1]
    assert r([2.0 ** -150], torch.float32) == [0] and r([3 * 2.0 ** -151], torch.float32) == [0x1]
    assert r([3.4028235677973366e38], torch.float32) == [0x7F800000]   # past the halfway above FLT_MAX
    assert r([float("nan")], torch.float32) == [None]
