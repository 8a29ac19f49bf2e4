"""Bitwise comparison and the mismatch report."""

import pytest
import torch

from lockstep.harness.compare import diff_data, diff_tensor, diff_tensors


def test_equal_tensors_have_no_diff():
    a = torch.randn(3, 4)
    assert diff_tensor("x", a, a.clone()) is None


def test_negative_zero_differs_from_zero():
    d = diff_tensor("x", torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]))
    assert d and d.n_diff == 1 and d.first_flat == 0 and "0x80000000" in d.actual_value


def test_nan_payloads_count():
    a = torch.tensor([0x7FC00000, 0x7FC00001], dtype=torch.int32).view(torch.float32)
    b = torch.tensor([0x7FC00000, 0x7FC00000], dtype=torch.int32).view(torch.float32)
    assert diff_tensor("x", a, a.clone()) is None  # NaN equals itself bitwise
    d = diff_tensor("x", a, b)
    assert d and d.n_diff == 1 and d.first_index == (1,)


def test_report_names_count_fraction_index_values_and_ulps():
    a = torch.zeros(4, 5)
    b = a.clone()
    b[2, 3] = torch.nextafter(torch.tensor(0.0), torch.tensor(1.0))  # 1 ULP
    b[3, 1] = 0.5
    d = diff_tensor("coins", a, b)
    text = d.describe()
    assert d.n_diff == 2 and d.numel == 20 and d.first_flat == 13 and d.first_index == (2, 3)
    assert "2 of 20 elements differ (10.0000%)" in text and "[2, 3]" in text
    assert d.max_abs == 0.5 and d.columns == (1, 3) and "columns (last dim) that differ: [1, 3]" in text
    assert d.max_ulp == 0x3F000000


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2, torch.float64])
def test_low_precision_dtypes(dtype):
    a = torch.tensor([1.0, 2.0, -3.0]).to(dtype)
    b = a.clone()
    b.view(torch.uint8)[-1] ^= 1  # flip one bit of the last element
    d = diff_tensor("x", a, b)
    assert d is not None and d.n_diff == 1 and d.first_index == (2,) and d.max_ulp >= 1


def test_integer_and_bool_tensors():
    d = diff_tensor("ids", torch.tensor([1, 2, 3]), torch.tensor([1, 2, 7]))
    assert d.n_diff == 1 and d.max_abs == 4 and d.max_ulp == 4
    assert diff_tensor("m", torch.tensor([True, False]), torch.tensor([True, True])).n_diff == 1


def test_dtype_shape_missing_and_unexpected():
    assert diff_tensor("x", torch.zeros(2), torch.zeros(2, dtype=torch.float64)).problem == "dtype"
    assert diff_tensor("x", torch.zeros(2), torch.zeros(3)).problem == "shape"
    diffs = diff_tensors({"a": torch.zeros(1)}, {"b": torch.zeros(1)})
    assert [(d.name, d.problem) for d in diffs] == [("a", "missing"), ("b", "unexpected")]


def test_data_diff():
    assert diff_data({"tokens": [1, 2, 3]}, {"tokens": [1, 2, 3]}) == ""
    text = diff_data({"tokens": [1, 2, 3]}, {"tokens": [1, 9, 3]})
    assert "root['tokens'][1]" in text and "9" in text


def test_data_diff_is_bitwise():
    """deepdiff alone compares with ==: the data half of a golden would call -0.0 equal to 0.0."""
    assert "0x8000000000000000" in diff_data({"x": [-0.0]}, {"x": [0.0]})
    assert diff_data({"x": [True]}, {"x": [1]}) and diff_data({"x": 1}, {"x": 1.0})
    assert diff_data({"x": float("nan")}, {"x": float("nan")}) == ""   # a NaN equals itself, bit for bit
    assert diff_data({"x": [0.5, -0.0]}, {"x": [0.5, -0.0]}) == ""


# ------------------------------------------------------------------ the report's numbers and words
# Found by mutation testing (docs/contributing.md): each test below pins a part of the mismatch
# report that the tests above let change unseen.

def _from_bits(bits: list[int], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of `dtype` holding exactly these bit patterns (unsigned ints of the dtype's width)."""
    width = torch.empty((), dtype=dtype).element_size() * 8
    signed = [b - (1 << width) if b >= 1 << (width - 1) else b for b in bits]
    view = {8: torch.int8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[width]
    return torch.tensor(signed, dtype=view).view(dtype)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_the_ulp_distance_counts_across_zero(dtype):
    """ULPs count representable values between the two: +0 and -0 are the same point (0 ULPs, yet
    a differing element), the smallest subnormals on either side of zero are 2 apart."""
    width = torch.empty((), dtype=dtype).element_size() * 8
    sign = 1 << (width - 1)
    plus_zero, minus_zero, tiny, minus_tiny = 0, sign, 1, sign | 1

    def ulps(expected_bits, actual_bits):
        d = diff_tensor("x", _from_bits([expected_bits], dtype), _from_bits([actual_bits], dtype))
        assert d is not None and d.n_diff == 1, f"{dtype}: {expected_bits:#x} vs {actual_bits:#x} must differ"
        return d.max_ulp

    assert ulps(plus_zero, minus_zero) == 0, f"{dtype}: +0 and -0 are 0 ULPs apart"
    assert ulps(plus_zero, tiny) == 1, f"{dtype}: +0 to the smallest subnormal is 1 ULP"
    assert ulps(minus_zero, minus_tiny) == 1, f"{dtype}: -0 to the smallest negative subnormal is 1 ULP"
    assert ulps(minus_tiny, tiny) == 2, f"{dtype}: -tiny to +tiny is 2 ULPs (through the one zero)"
    assert ulps(tiny, minus_tiny) == 2, f"{dtype}: the distance has no direction"
    assert ulps(sign | 5, 3) == 8, f"{dtype}: -5 ULPs below zero to 3 above is 8"
    top = int(_bits_of(torch.tensor([torch.finfo(dtype).max], dtype=dtype)))
    assert ulps(top, sign | top) == 2 * top, f"{dtype}: max to -max counts every value, past the int{width} range"


def test_integer_differences_past_the_int64_range_are_exact():
    """int64 values of opposite sign near the extremes differ by more than int64 holds: the report
    gives the exact distance, not a wrapped one."""
    low, high = torch.iinfo(torch.int64).min, torch.iinfo(torch.int64).max
    d = diff_tensor("x", torch.tensor([high, 7, high - 1]), torch.tensor([low, 7, low + 3]))
    assert d is not None and d.n_diff == 2 and d.max_ulp == high - low


def _bits_of(t: torch.Tensor) -> int:
    width = t.element_size() * 8
    view = {8: torch.int8, 16: torch.int16, 32: torch.int32, 64: torch.int64}[width]
    return t.view(view).item() & ((1 << width) - 1)


def test_the_report_of_a_bit_difference_in_full():
    """Every line of describe(), with the names of the two sides that locate gives it."""
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    b = a.clone()
    b[1, 0] = torch.nextafter(torch.tensor(3.0), torch.tensor(4.0))   # 0x40400001: the low bit shows
    b[1, 1] = 4.5
    d = diff_tensor("logits", a, b)
    assert (d.name, d.problem, d.n_diff, d.numel, d.first_flat, d.first_index) == ("logits", "bits", 2, 4, 2, (1, 0))
    assert d.expected_value == "3.0 (0x40400000)" and d.actual_value == "3.000000238418579 (0x40400001)"
    assert (d.max_abs, d.max_rel, d.max_ulp) == (0.5, 0.125, 0x100000), "4.0 -> 4.5: 0.5 abs, 0.5/4 rel, 2^20 ULPs"
    assert d.columns == (0, 1)
    d.sides = ("the trace", "the replay")
    assert d.describe() == (
        "tensor 'logits': 2 of 4 elements differ (50.0000%)\n"
        "  first difference at flat index 2 = [1, 0]: the trace 3.0 (0x40400000), the replay 3.000000238418579 (0x40400001)\n"
        "  max abs diff 0.5, max rel diff 0.125, max ULP diff 1048576\n"
        "  columns (last dim) that differ: [0, 1]")


def test_the_relative_difference_measures_from_the_expected_side_and_skips_undefined_ones():
    """rel = |e - a| / |e|; an element where it is undefined (0/0 for +0 vs -0, a NaN) is left out
    of the max so it does not hide the rest; NaN only when it is undefined everywhere."""
    nan = float("nan")
    d = diff_tensor("x", torch.tensor([0.0, 2.0, nan, -8.0]), torch.tensor([-0.0, 3.0, 1.0, -6.0]))
    assert (d.max_abs, d.max_rel) == (2.0, 0.5), "max |e-a| = 2 (-8 vs -6); max rel = 1/2 (2 vs 3), not 2/8"
    d = diff_tensor("x", torch.tensor([0.0]), torch.tensor([-0.0]))
    assert d.max_abs == 0.0 and d.max_rel != d.max_rel, "+0 vs -0 only: no relative difference (NaN)"
    assert diff_tensor("x", torch.tensor([0.0]), torch.tensor([1.0])).max_rel == float("inf"), "x / 0 is inf"


def test_integer_reports_measure_from_the_expected_side_without_overflow():
    d = diff_tensor("ids", torch.tensor([4, 10]), torch.tensor([4, 2]))
    assert (d.max_abs, d.max_rel, d.max_ulp) == (8.0, 0.8, 8), "|10 - 2| = 8, 8 / 10 = 0.8"
    assert d.expected_value == "10" and d.actual_value == "2"
    d = diff_tensor("q", torch.tensor([-128], dtype=torch.int8), torch.tensor([0], dtype=torch.int8))
    assert (d.max_abs, d.max_rel, d.max_ulp) == (128.0, 1.0, 128), "int8 -128: |e| taken in float64, not int8"
    assert d.describe().splitlines()[1].endswith("golden -128, got 0")


def test_columns_are_the_last_dimension_and_a_long_list_is_cut():
    a = torch.zeros(2, 3, 4)
    b = a.clone()
    b[1, 2, 3] = 1.0
    b[0, 1, 1] = 1.0
    assert diff_tensor("x", a, b).columns == (1, 3), "the last dim of a 3-D tensor, not its dim 1"
    ten, eleven = torch.zeros(1, 10), torch.zeros(1, 11)
    text10 = diff_tensor("x", ten, ten + 1).describe()
    text11 = diff_tensor("x", eleven, eleven + 1).describe()
    assert text10.endswith("columns (last dim) that differ: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]"), text10
    assert text11.endswith("columns (last dim) that differ: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] … (11 columns)"), text11


def test_a_zero_dim_tensor_reports_an_empty_index():
    d = diff_tensor("s", torch.tensor(1.0), torch.tensor(2.0))
    assert d.first_index == () and d.columns == () and "flat index 0 = []" in d.describe()


def test_the_dtype_shape_missing_and_unexpected_reports_read_well():
    d = diff_tensor("x", torch.zeros(2), torch.zeros(2, dtype=torch.float64))
    assert d.describe() == "tensor 'x': dtype differs: golden torch.float32, got torch.float64"
    d = diff_tensor("y", torch.zeros(2), torch.zeros(3))
    assert d.describe() == "tensor 'y': shape differs: golden [2], got [3]"
    d.sides = ("the trace", "the replay")
    assert d.describe() == "tensor 'y': shape differs: the trace [2], got [3]", "the reference side is named"
    diffs = diff_tensors({"a": torch.zeros(1)}, {"b": torch.zeros(1)})
    assert [d.describe() for d in diffs] == ["tensor 'a': in the golden but not produced by the run",
                                             "tensor 'b': produced by the run but not in the golden"]


def test_tensors_in_both_are_compared_bit_for_bit_and_only_the_differing_are_listed():
    expected = {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([3.0]), "c": torch.tensor([0.0])}
    actual = {"a": torch.tensor([1.0, 2.5]), "b": torch.tensor([3.0]), "c": torch.tensor([-0.0])}
    diffs = diff_tensors(expected, actual)
    assert [(d.name, d.problem, d.first_flat) for d in diffs] == [("a", "bits", 1), ("c", "bits", 0)]
    assert diffs[0].expected_value == "2.0 (0x40000000)" and diffs[0].actual_value == "2.5 (0x40200000)"


def test_to_json_is_plain_json_with_one_key_per_field():
    import dataclasses
    import json

    from lockstep.harness.compare import TensorDiff

    d = diff_tensor("x", torch.zeros(2, 2), torch.eye(2))
    d.sides = ("the trace", "the replay")
    out = d.to_json()
    assert set(out) == {f.name for f in dataclasses.fields(TensorDiff)}, sorted(out)
    assert (out["first_index"], out["columns"], out["sides"]) == ([0, 0], [0, 1], ["the trace", "the replay"])
    assert json.loads(json.dumps(out)) == out, "tuples are lists already: the JSON reads back the same"
    assert {k: out[k] for k in ("name", "problem", "n_diff", "numel", "first_flat", "max_ulp")} == {
        "name": "x", "problem": "bits", "n_diff": 2, "numel": 4, "first_flat": 0, "max_ulp": 0x3F800000}


def test_data_diff_keeps_order_and_shows_added_values():
    assert diff_data({"t": [1, 2]}, {"t": [2, 1]}), "token order matters"
    text = diff_data({"a": 1}, {"a": 1, "b": [5]})
    assert "root['b'] ([5]) added" in text, text


def _exact_max_distance(expected: list[int], actual: list[int]) -> int:
    return max(abs(e - a) for e, a in zip(expected, actual) if e != a)


@pytest.mark.parametrize("span", [2**62, 2**35, 2**31], ids=["full-range", "a-few-high-words", "low-word"])
def test_the_largest_integer_difference_is_found_among_many(span):
    """The largest |e - a| of many differing int64 elements is found exactly, whichever element
    holds it: the float64 ranking of the high and low 32-bit halves must put it among the few
    redone in Python (a halves' weight, sign or shift off ranks another element first)."""
    g = torch.Generator().manual_seed(span % 1000)
    e = torch.randint(-span, span, (500,), generator=g, dtype=torch.int64)
    a = torch.randint(-span, span, (500,), generator=g, dtype=torch.int64)
    d = diff_tensor("x", e, a)
    assert d is not None and d.max_ulp == _exact_max_distance(e.tolist(), a.tolist())


def test_the_ranking_keeps_the_low_word_of_a_high_word_past_float32():
    """A high word of 26 significant bits ranked in float32 would round away its last bit, and an
    element 2^31 smaller would be reported instead of the largest."""
    big = (2**25 + 1) * 2**32                     # |difference| 2^57 + 2^32: the largest
    near = 2**57 + 2**31                           # 2^31 less
    d = diff_tensor("x", torch.tensor([big, near, 9]), torch.tensor([0, 0, 9]))
    assert d is not None and d.max_ulp == big
    d = diff_tensor("x", torch.tensor([2**40, 3]), torch.tensor([2**41, 0]))
    assert d.max_ulp == 2**40, "both sides' high words shift by 32 (2^41 >> 33 would cancel 2^40 >> 32)"


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32])
def test_narrow_integer_differences_rank_negative_values_by_their_distance(dtype):
    """A negative narrow integer is widened to int64 before its halves are split: -7 vs 0 is 7,
    less than 100 vs 0 (split unwidened, -7's high half reads -1 and it ranks first)."""
    e, a = torch.tensor([-7, 100, 3], dtype=dtype), torch.tensor([0, 0, 3], dtype=dtype)
    assert diff_tensor("x", e, a).max_ulp == 100
    assert diff_tensor("x", a, e).max_ulp == 100, "the same from the other side"


def test_the_ulp_distance_of_many_floats_of_either_sign_is_the_largest():
    """ULP distances of float32 elements are ranked in int64: two subnormals across zero (2 ULPs)
    do not outrank 1.0 against 2.0 (2^23 ULPs)."""
    tiny = torch.tensor([1], dtype=torch.int32).view(torch.float32)
    e = torch.cat([-tiny, torch.tensor([1.0, 5.0])])
    a = torch.cat([tiny, torch.tensor([2.0, 5.0])])
    d = diff_tensor("x", e, a)
    assert d is not None and d.n_diff == 2 and d.max_ulp == 2**23
