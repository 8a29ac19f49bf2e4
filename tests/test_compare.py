"""Bitwise comparison and the mismatch report."""

import pytest
import torch

from harness.compare import diff_data, diff_tensor, diff_tensors


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
