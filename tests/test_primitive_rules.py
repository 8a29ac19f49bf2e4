"""The primitive kind's own rules, without its grids' full runs (harness/kinds/primitive.py): which
bits are NaN in each format, the exact-rounding and scan oracles on worked answers, the ulp check,
the Triton-against-torch comparison with its NaN and subnormal allowances, the spec checks, and
`run`'s failure reports with a given implementation put in place of Lockstep's."""

from __future__ import annotations

import math
import struct
import warnings
from fractions import Fraction
from types import SimpleNamespace

import pytest
import torch

from lockstep.harness.kinds import primitive as pk

F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16


def f32(*bits):
    return pk._from_bits(list(bits), F32)


def f64_bits(v):
    return struct.unpack("<Q", struct.pack("<d", v))[0]


# ---------------------------------------------------------------- NaN bits per format
@pytest.mark.parametrize("dtype, bits, nan", [
    (F32, 0x7F800000, False), (F32, 0xFF800000, False), (F32, 0x7F7FFFFF, False), (F32, 0x7F800001, True),
    (F32, 0xFF800001, True), (F32, 0x7FC00000, True), (F32, 0xFFFFFFFF, True), (F32, 0x00000001, False),
    (BF16, 0x7F80, False), (BF16, 0x7F81, True), (BF16, 0xFFC0, True), (BF16, 0xFF80, False),
    (F64, 0x7FF0000000000000, False), (F64, 0x7FF0000000000001, True), (F64, 0xFFF8000000000000, True),
    (F64, 0x7FEFFFFFFFFFFFFF, False),
])
def test_which_bits_are_nan(dtype, bits, nan):
    assert pk._is_nan_bits(bits, dtype) is nan


# ---------------------------------------------------------------- exact rounding
def test_round_to_keeps_infinities_signed_zeros_and_any_nan():
    assert pk.round_to([math.inf, -math.inf, math.nan, -0.0, 0.0], F32) == [0x7F800000, 0xFF800000, None,
                                                                            0x80000000, 0]
    assert pk.round_to([math.inf, -math.inf, -0.0], BF16) == [0x7F80, 0xFF80, 0x8000]
    assert pk.round_to([-math.inf, Fraction(-1, 3), Fraction(0)], F64) == [0xFFF0000000000000, 0xBFD5555555555555, 0]
    assert pk.round_to([Fraction(1, 3), Fraction(-1, 3)], F32) == [0x3EAAAAAB, 0xBEAAAAAB]
    assert pk.round_to([Fraction(1, 3)], BF16) == [0x3EAB]


@pytest.mark.parametrize("value, bits", [
    (Fraction(1), 0x3F800000),
    (Fraction(2) - Fraction(1, 2 ** 24), 0x40000000),          # the halfway below 2: up into the next binade
    (Fraction(2) - Fraction(1, 2 ** 23), 0x3FFFFFFF),
    (Fraction(3, 2 ** 150), 0x2),                               # 1.5 subnormal steps: a tie, to even (2)
    (Fraction(5, 2 ** 151), 0x1),                               # 1.25 steps: down
    (Fraction(1, 2 ** 150), 0x0),                               # half the smallest subnormal: a tie, to even (0)
    (Fraction(2 ** 126 - 1, 2 ** 252), 0x00800000),             # just under the smallest normal: rounds up to it
    (Fraction(2 ** 128), 0x7F800000),
    (Fraction(2 ** 128 - 2 ** 103), 0x7F800000),                # the halfway above FLT_MAX
    (Fraction(2 ** 128 - 2 ** 103 - 1), 0x7F7FFFFF),
    (Fraction(3, 2), 0x3FC00000),
])
def test_exact_bits_worked_answers(value, bits):
    assert pk._exact_bits(value, 24, -126, 127, 32) == bits
    assert pk._exact_bits(-value, 24, -126, 127, 32) == bits | 0x80000000


def test_exact_bits_of_zero_carry_the_sign_asked_for():
    assert pk._exact_bits(Fraction(0), 24, -126, 127, 32) == 0
    assert pk._exact_bits(Fraction(0), 24, -126, 127, 32, negative=True) == 0x80000000


def test_the_exact_oracle_of_sqrt_and_the_casts():
    x = torch.tensor([math.nan, -1.0, -0.0, 0.0, math.inf, -math.inf, 4.0, 2.0, -math.nan])
    assert pk.exact_oracle("sqrt", x) == [None, None, 0x80000000, 0, 0x7F800000, None, 0x40000000, 0x3FB504F3, None]
    assert pk.exact_oracle("sqrt64", x.double()) == [None, None, 1 << 63, 0, 0x7FF0000000000000, None,
                                                     0x4000000000000000, f64_bits(math.sqrt(2.0)), None]
    assert pk.exact_oracle("to_bf16", torch.tensor([1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, math.nan, -0.0])) == \
        [0x3F80, 0x3F82, None, 0x8000]
    assert pk.exact_oracle("to_fp32", torch.tensor([1.0, -0.0, math.inf], dtype=BF16)) == [0x3F800000, 0x80000000,
                                                                                         0x7F800000]
    x64 = torch.tensor([7.006492321624085e-46, 7.0064923216240862e-46, 1.0 + 2 ** -24, math.nan], dtype=F64)
    assert pk.exact_oracle("f64_to_f32", x64) == [0, 1, 0x3F800000, None]
    with pytest.raises(ValueError, match="^exp$"):
        pk.exact_oracle("exp", x)


# ---------------------------------------------------------------- the scan oracle: the documented orders
BIG, ONE, NEG_BIG = 0x4CBEBC20, 0x3F800000, 0xCCBEBC20          # 1e8, 1.0, -1e8 in float32


def test_tree_sum_pairs_the_tail_onto_the_head():
    """[1e8, 1, -1e8]: (1e8 + -1e8) + 1 = 1; left to right it would be 0 (1e8 + 1 rounds to 1e8)."""
    assert pk.scan_oracle("tree_sum", f32(BIG, ONE, NEG_BIG).view(1, 3)) == [ONE]
    # [1e8, -1e8, 1, 1, 1]: the fifth onto the first, then pairs: (1e8 + 1) + 1, (-1e8 + 1) + 1 -> 1e8 - 1e8 = 0
    # (left to right: 3)
    assert pk.scan_oracle("tree_sum", f32(BIG, NEG_BIG, ONE, ONE, ONE).view(1, 5)) == [0]
    assert pk.scan_oracle("tree_sum", f32(0x7FC00001, ONE).view(1, 2)) == [None]


def test_prefix_sum_doubles_its_step():
    """Hillis-Steele on [1e8, 1, -1e8, 1]: [1e8, 1e8, 0, 0] (sequentially the last would be 1)."""
    assert pk.scan_oracle("prefix_sum", f32(BIG, ONE, NEG_BIG, ONE).view(1, 4)) == [BIG, BIG, 0, 0]
    assert pk.scan_oracle("prefix_sum", f32(ONE, ONE, ONE, ONE, ONE).view(1, 5)) == \
        [ONE, 0x40000000, 0x40400000, 0x40800000, 0x40A00000]


def test_the_scan_oracle_is_quiet_on_inf_minus_inf_and_overflow():
    rows = f32(0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x7F7FFFFF).view(1, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fn in ("tree_sum", "prefix_sum", "running_sum"):
            pk.scan_oracle(fn, rows)
    assert pk.scan_oracle("prefix_sum", rows) == [0x7F800000, None, None, None]


def test_running_sum_is_float64_from_plus_zero():
    rows = torch.stack([f32(0x80000000, BIG, ONE), f32(ONE, 0xFFC00002, ONE)])
    assert pk.scan_oracle("running_sum", rows) == [0, f64_bits(1e8), f64_bits(100000001.0),
                                                   f64_bits(1.0), None, None]


# ---------------------------------------------------------------- ulps from Python's math
def test_ulps_and_math():
    assert pk._ulps(0x3F800000, 0x3F800003, 32) == 3
    assert pk._ulps(0x00000001, 0x80000001, 32) == 2 and pk._ulps(0, 0x80000000, 32) == 0
    assert pk._ulps(0x8000000000000001, 0x0000000000000002, 64) == 3
    assert pk._ulps(0xC0000000, 0x40000000, 32) == 0x80000000           # -2.0 to 2.0: the sign bit is bit 31
    assert pk._ulps(0x40000000, 0x3F800000, 32) == 0x800000
    assert math.isnan(pk._math("log", -1.0)) and math.isnan(pk._math("log64", math.nan))
    assert pk._math("log", 0.0) == -math.inf and pk._math("log", math.e) == 1.0
    assert pk._math("exp", 1000.0) == math.inf and pk._math("exp64", 0.0) == 1.0
    assert pk._math("sigmoid", -1000.0) == 0.0 and pk._math("sigmoid", 0.0) == 0.5
    with pytest.raises(ValueError, match="^sqrt$"):
        pk._math("sqrt", 1.0)


def exact_exp(x):
    return pk._from_bits(pk.round_to([pk._math("exp", v) for v in x.double().tolist()], F32), F32)


def test_ulp_failures_count_and_name_the_worst():
    x = torch.tensor([0.0, 1.0, 2.0, 100.0, -200.0])
    y = exact_exp(x)
    assert pk.ulp_failures("exp", x, y, 0) == []
    bits = pk._bits_of(y)
    bits[1] += 3
    bits[2] -= 2
    bad = pk._from_bits(bits, F32)
    assert pk.ulp_failures("exp", x, bad, 3) == []
    assert pk.ulp_failures("exp", x, bad, 1) == [
        f"exp: 2 results are more than 1 ulps from Python's math; worst at input 1.0: 3 ulps (got 0x{bits[1]:x})"]
    assert pk.ulp_failures("exp", x, bad, 2) == [
        f"exp: 1 results are more than 2 ulps from Python's math; worst at input 1.0: 3 ulps (got 0x{bits[1]:x})"]
    bits = pk._bits_of(y)
    bits[1] += 1                                              # the only failure is 1 ulp off
    assert pk.ulp_failures("exp", x, pk._from_bits(bits, F32), 0) == [
        f"exp: 1 results are more than 0 ulps from Python's math; worst at input 1.0: 1 ulps (got 0x{bits[1]:x})"]


def test_ulp_failures_where_nan_ness_differs():
    x = torch.tensor([-1.0, 1.0, 4.0])
    want = pk.round_to([pk._math("log", v) for v in x.double().tolist()], F32)
    assert pk.ulp_failures("log", x, pk._from_bits([0x7FC00123] + want[1:], F32), 0) == []      # any NaN
    y = pk._from_bits([0x3F800000, 0x7FC00000, want[2] + 5], F32)
    assert pk.ulp_failures("log", x, y, 0) == [
        "log: 3 results are more than 0 ulps from Python's math; worst at input 1.0: NaN-ness differs (got 0x7fc00000)"]


def test_ulp_failures_of_sincos_skip_the_outside_of_its_domain():
    x = torch.tensor([0.5, 2e6, math.inf, -1.0], dtype=F64)
    sin = torch.tensor([math.sin(0.5), 7.0, 7.0, math.sin(-1.0)], dtype=F64)
    cos = torch.tensor([math.cos(0.5), 7.0, 7.0, math.cos(-1.0)], dtype=F64)
    assert pk.ulp_failures("sincos64", x, (sin, cos), 0) == []
    cos[3] = math.cos(-1.0) * (1 + 2 ** -50)
    out = pk.ulp_failures("sincos64", x, (sin, cos), 1)
    assert out == [f"cos: 1 results are more than 1 ulps from Python's math; worst at input -1.0: 4 ulps "
                   f"(got 0x{f64_bits(float(cos[3])):x})"]
    cos[3] = math.cos(-1.0)
    sin[0] = -math.sin(0.5)                                   # the sign wrong: twice the magnitude in ulps
    assert pk.ulp_failures("sincos64", x, (sin, cos), 1) == [
        f"sin: 1 results are more than 1 ulps from Python's math; worst at input 0.5: "
        f"{2 * f64_bits(math.sin(0.5))} ulps (got 0x{f64_bits(-math.sin(0.5)):x})"]


def test_the_domain_of_sincos_ends_at_1_6e6_inclusive():
    x = torch.tensor([1.6e6, 1600000.5], dtype=F64)
    sin = torch.tensor([7.0, 7.0], dtype=F64)
    cos = torch.tensor([math.cos(1.6e6), 7.0], dtype=F64)
    (msg,) = pk.ulp_failures("sincos64", x, (sin, cos), 1)
    assert msg.startswith("sin: 1 results are more than 1 ulps from Python's math; worst at input 1600000.0:")


# ---------------------------------------------------------------- Triton against torch
SUB = 0x00000100                                              # a subnormal input


def compare(exp, y_bits, ref_bits, fn="exp", x=None, suffix=""):
    notes = []
    x = f32(0x3F800000, 0x7FC00000, SUB, 0x40000000) if x is None else x
    out = pk._match_torch(fn, x, pk._from_bits(y_bits, F32), pk._from_bits(ref_bits, F32), exp, notes, suffix)
    return out, notes


def test_triton_against_torch_nan_payloads_and_subnormals():
    y, ref = [0x402DF854, 0x7FC00001, 0x3F800001, 0x40EC7326], [0x402DF854, 0x7FC00000, 0x3F800000, 0x40EC7326]
    assert compare({}, y, ref) == ([
        "exp (triton): 2 of 4 results differ from the torch implementation; first at flat index 1 (input nan): "
        "triton 0x7fc00001, torch 0x7fc00000"], [])
    assert compare({"any_nan": True}, y, ref) == ([
        "exp (triton): 1 of 4 results differ from the torch implementation; first at flat index 2 (input 3.587324068671532e-43): "
        "triton 0x3f800001, torch 0x3f800000"], [])
    assert compare({"any_nan": True, "except_subnormal": True}, y, ref) == \
        ([], ["exp: 1 subnormal inputs left out of the comparison with torch"])
    assert compare({"except_subnormal": True}, y, ref)[0][0].startswith("exp (triton): 1 of 4 results differ")
    y[1] = 0x3F800000                                         # a number where torch has a NaN: never allowed
    assert compare({"any_nan": True, "except_subnormal": True}, y, ref)[0][0].startswith(
        "exp (triton): 1 of 4 results differ from the torch implementation; first at flat index 1 (input nan)")
    assert compare({"any_nan": True}, ref[:1] + [0x7F800000] + ref[2:], ref)[0][0].endswith(
        "triton 0x7f800000, torch 0x7fc00000")               # inf is not a NaN


def test_the_subnormal_inputs_are_exactly_those():
    x = f32(0x00000001, 0x007FFFFF, 0x00800000, 0x80000001, 0x00000000, 0x80000000, 0x40000001)
    out, notes = compare({"except_subnormal": True}, [1] * 7, [2] * 7, x=x)
    assert notes == ["exp: 3 subnormal inputs left out of the comparison with torch"]
    assert out[0].startswith("exp (triton): 4 of 7 results differ") and "flat index 2" in out[0]


def test_a_scan_names_the_row():
    rows = f32(*[0x3F800000] * 6).view(2, 3)
    y = pk._from_bits([0x3F800000] * 4 + [0x40000000, 0x3F800000], F32).view(2, 3)
    notes = []
    out = pk._match_torch("block_cumsum", rows, y, rows, {}, notes, "3")
    assert out == ["block_cumsum (triton, length 3): 1 of 6 results differ from the torch implementation; first at "
                   "flat index 4 (input row 1): triton 0x40000000, torch 0x3f800000"]
    out = pk._match_torch("block_sum", rows, y.reshape(-1), rows.reshape(-1), {}, notes, "")
    assert "(input row 4)" in out[0]


def test_compiled_triton_is_not_compared(monkeypatch):
    import lockstep.kernels._common
    monkeypatch.setattr(lockstep.kernels._common, "PORTABLE_MATH", False)
    notes = []
    assert pk._match_torch("exp", f32(0), f32(1), f32(2), {}, notes, "") == []
    assert notes == ["exp: compiled Triton uses the GPU's own functions, not compared with the torch implementation"]


# ---------------------------------------------------------------- the spec's checks
def doc(fn, impl="torch", **expect):
    return {"inputs": {"function": fn, "implementation": impl}, "expect": expect}


@pytest.mark.parametrize("d, problems", [
    (doc("exp", oracle_ulp=1), []),
    (doc("sqrt", oracle="exact"), []),
    (doc("exp", "triton", matches_torch=True, any_nan=True, except_subnormal=True), []),
    (doc("block_sum", "torch"), [(("inputs", "function"), "block_sum has no torch implementation (it has: "
                                  + ", ".join(pk.TORCH) + ")")]),
    (doc("sincos64", "triton"), [(("inputs", "function"), "sincos64 has no triton implementation (it has: "
                                  + ", ".join(pk.TRITON) + ")")]),
    (doc("exp", oracle="exact"), [(("expect", "oracle"), "no exact oracle for exp (only "
                                   + ", ".join(pk.ORACLE_EXACT) + ")")]),
    (doc("sqrt", oracle_ulp=0), [(("expect", "oracle_ulp"), "no ulp oracle for sqrt (only "
                                  + ", ".join(pk.ORACLE_ULP) + ")")]),
    (doc("exp", matches_torch=True), [(("expect", "matches_torch"),
                                       "only for a triton implementation of a function torch has")]),
    (doc("block_sum", "triton", matches_torch=True), [(("expect", "matches_torch"),
                                                       "only for a triton implementation of a function torch has")]),
    (doc("exp", "triton", any_nan=True, except_subnormal=True), [(("expect", "any_nan"), "only with matches_torch"),
                                                                 (("expect", "except_subnormal"),
                                                                  "only with matches_torch")]),
])
def test_validate(d, problems):
    assert [(p.path, p.message) for p in pk.validate(d)] == problems
    # a problem with the expect block points at its key; one with the function at its value
    assert [p.at_key for p in pk.validate(d)] == [p[0][0] == "expect" for p in problems]


def test_validate_without_expect_and_the_golden_folder():
    assert pk.validate({"inputs": {"function": "exp", "implementation": "torch"}, "expect": None}) == []
    ctx = SimpleNamespace(fixed_platform="cpu-fp32")
    assert pk.golden_platform(SimpleNamespace(inputs={"implementation": "torch"}), ctx) == "shared"
    assert pk.golden_platform(SimpleNamespace(inputs={"implementation": "triton"}), ctx) == "cpu-fp32-triton"


# ---------------------------------------------------------------- run(), with a given implementation
def run(fn, impl, expect, prim, asked=None):
    def op(name, device, why):
        if asked is not None:
            asked.append((name, device, why))
        return prim
    spec = SimpleNamespace(inputs={"function": fn, "implementation": impl}, expect=expect)
    return pk.run(spec, SimpleNamespace(device=torch.device("cpu")), SimpleNamespace(op=op))


def portable(fn, impl, x):
    """Lockstep's torch implementation (lockstep.kernels.portable), which the oracles hold exact."""
    from lockstep.harness.targets.lockstep_run import torch_impl
    return torch_impl(fn, x)


def test_run_passes_a_correct_sqrt_and_names_a_wrong_one():
    asked = []
    r = run("sqrt", "torch", {"oracle": "exact"}, portable, asked)
    assert asked == [("primitive", "cpu", "kind 'primitive' has no target runner")]
    x = pk.grid("sqrt")
    assert r.data == {"failures": [], "inputs_sha256": {"x": pk.tensor_sha256(x)}} and list(r.tensors) == ["y"]
    assert torch.equal(r.tensors["y"].view(torch.int32), portable("sqrt", "torch", x).view(torch.int32))
    assert r.notes == []

    def payload(fn, impl, x):                                # another NaN payload: still the exact rounding
        y = portable(fn, impl, x)
        return torch.where(torch.isnan(y), torch.tensor(float("-nan")), y)
    assert run("sqrt", "torch", {"oracle": "exact"}, payload).data["failures"] == []

    def zero_for_negatives(fn, impl, x):
        return torch.where(x < 0, torch.zeros_like(x), portable(fn, impl, x))
    (msg,) = run("sqrt", "torch", {"oracle": "exact"}, zero_for_negatives).data["failures"]
    first = next(i for i, v in enumerate(x.tolist()) if v < 0)
    n_neg = int((x < 0).sum())
    assert msg == (f"sqrt (torch): {n_neg} of {x.numel()} results are not the exact rounding; first at flat index "
                   f"{first}: got 0x0, exact a NaN")

    def nan_for_zero(fn, impl, x):
        return torch.where(x == 0, torch.tensor(float("nan")), portable(fn, impl, x))
    (msg,) = run("sqrt", "torch", {"oracle": "exact"}, nan_for_zero).data["failures"]
    first = next(i for i, v in enumerate(x.tolist()) if v == 0)
    assert msg.startswith(f"sqrt (torch): 2 of {x.numel()} results are not the exact rounding; first at flat index "
                          f"{first}: got 0x7fc00000, exact 0x0")


def test_run_of_a_scan_names_the_length():
    r = run("running_sum", "torch", {"oracle": "exact"}, portable)
    assert sorted(r.tensors) == sorted(f"y{n}" for n in pk.SCAN_LENGTHS) and r.data["failures"] == []
    assert sorted(r.data["inputs_sha256"]) == sorted(f"x{n}" for n in pk.SCAN_LENGTHS)

    def signed_zero_kept(fn, impl, x):                       # the all -0.0 row's leading -0.0 kept
        y = portable(fn, impl, x).clone()
        y[2, 0] = -0.0
        return y
    fails = run("running_sum", "torch", {"oracle": "exact"}, signed_zero_kept).data["failures"]
    assert len(fails) == len(pk.SCAN_LENGTHS)
    assert fails[0] == ("running_sum (torch, length 1): 1 of 7 results are not the exact rounding; first at flat "
                        "index 2: got 0x8000000000000000, exact 0x0")
    assert fails[1].startswith("running_sum (torch, length 2): 1 of 14 results are not the exact rounding; first at "
                               "flat index 4:")
    assert run("tree_sum", "torch", {"oracle": "exact"}, portable).data["failures"] == []    # its own order


def test_run_compares_triton_with_torch_and_skips_oracles_when_compiled(monkeypatch):
    calls = []

    def prim(fn, impl, x):
        calls.append(impl)
        y = portable(fn, impl, x)
        return torch.where(x == 4.0, torch.tensor(2.5), y) if impl == "triton" else y
    r = run("sqrt", "triton", {"matches_torch": True}, prim)
    assert calls == ["triton", "torch"]
    (msg,) = r.data["failures"]
    assert msg.startswith("sqrt (triton): 1 of ") and "(input 4.0): triton 0x40200000, torch 0x40000000" in msg
    import lockstep.kernels._common
    monkeypatch.setattr(lockstep.kernels._common, "PORTABLE_MATH", False)
    r = run("sqrt", "triton", {"oracle": "exact", "matches_torch": True}, prim)
    assert r.data["failures"] == [] and r.notes == [
        "sqrt: compiled Triton uses the GPU's own functions (FMA, approximate sqrt): pinned by this platform's "
        "golden, not held to the oracle"]
    r = run("sqrt", "torch", {"oracle": "exact"}, lambda fn, impl, x: prim(fn, "triton", x))
    assert len(r.data["failures"]) == 1 and r.notes == []          # the torch path is held to the oracle always


def test_run_keeps_every_failure_and_note_of_a_triton_primitive():
    def prim(fn, impl, x):
        y = portable(fn, impl, x)
        return torch.where(x == 1.0, torch.tensor(3.0), y) if impl == "triton" else y
    r = run("exp", "triton", {"oracle_ulp": 1, "matches_torch": True, "except_subnormal": True}, prim)
    assert len(r.data["failures"]) == 2
    assert r.data["failures"][0].startswith("exp (triton): exp: 1 results are more than 1 ulps from Python's math; "
                                            "worst at input 1.0:")
    assert r.data["failures"][1].startswith("exp (triton): 1 of ")
    assert r.notes[0].startswith("exp: ") and r.notes[0].endswith(" subnormal inputs left out of the comparison with torch")
    assert run("exp", "torch", {"oracle_ulp": 1}, portable).data["failures"] == []


def test_run_names_the_length_of_a_scan_against_torch():
    def prim(fn, impl, x):
        y = portable(fn, impl, x).clone()                     # (a row of one may come back as x itself)
        if impl == "triton":
            y[0, 0] = -y[0, 0]
        return y
    r = run("prefix_sum", "triton", {"matches_torch": True}, prim)
    assert r.data["failures"][0].startswith("prefix_sum (triton, length 1): 1 of 7 results differ from the torch "
                                            "implementation; first at flat index 0 (input row 0)")
    assert len(r.data["failures"]) == len(pk.SCAN_LENGTHS)


def test_run_of_sincos_keeps_both_outputs_and_checks_both():
    r = run("sincos64", "torch", {"oracle_ulp": 1}, portable)
    assert sorted(r.tensors) == ["cos", "sin"] and r.data["failures"] == []

    def cos_off(fn, impl, x):
        s, c = portable(fn, impl, x)
        return s, torch.where(x == 0.5, torch.tensor(0.5, dtype=F64), c)
    (msg,) = run("sincos64", "torch", {"oracle_ulp": 1}, cos_off).data["failures"]
    assert msg.startswith("sincos64 (torch): cos: 1 results are more than 1 ulps from Python's math; worst at input 0.5:")


def test_check_reads_the_failures():
    assert pk.check(None, SimpleNamespace(data={"failures": ["a", "b"]})) == ["a", "b"]
    assert pk.check(None, SimpleNamespace(data={})) == []
