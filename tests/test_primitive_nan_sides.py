"""The primitive kind's NaN exemptions hold only where both sides are NaN: `any_nan` lets two NaN
payloads differ between Triton and torch, never a NaN on one side and a number on the other
(either side), and the ulp oracle counts a NaN where Python's math gives a number, and the
reverse. Each pin beside planted faults that turn it red."""

from __future__ import annotations

import pytest
import torch

from lockstep.harness.kinds import primitive as pk
from tests.planted import module_with

F32 = torch.float32
X = [0x3F800000, 0x40000000, 0x40400000]                     # 1, 2, 3: ordinary inputs


def red(pin, *args) -> None:
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        pin(*args)


def differ(match_torch, y_bits, ref_bits) -> list[str]:
    x = pk._from_bits(X, F32)
    return match_torch("exp", x, pk._from_bits(y_bits, F32), pk._from_bits(ref_bits, F32), {"any_nan": True}, [], "")


def pin_any_nan_needs_both(match_torch) -> None:
    ref = [0x402DF854, 0x40EC7326, 0x41A0AF2E]
    assert differ(match_torch, ref, ref) == []
    assert differ(match_torch, [0x7FC00001, ref[1], 0xFFC00002], [0x7FC00000, ref[1], 0x7FC00003]) == []   # payloads
    for side, (y, want) in {"triton": ([ref[0], 0x7FC00000, ref[2]], ref),
                            "torch": (ref, [ref[0], 0x7FC00000, ref[2]])}.items():
        out = differ(match_torch, y, want)
        assert len(out) == 1 and "1 of 3 results differ" in out[0] and "flat index 1" in out[0], (side, out)


def test_any_nan_needs_both():
    pin_any_nan_needs_both(pk._match_torch)


@pytest.mark.parametrize("plant", [
    {"exp.get(\"any_nan\") and _is_nan_bits(g, y.dtype) and _is_nan_bits(w, y.dtype))":
     "exp.get(\"any_nan\") and _is_nan_bits(g, y.dtype))"},
    {"exp.get(\"any_nan\") and _is_nan_bits(g, y.dtype) and _is_nan_bits(w, y.dtype))":
     "exp.get(\"any_nan\") and _is_nan_bits(w, y.dtype))"},
    {"exp.get(\"any_nan\") and _is_nan_bits(g, y.dtype) and _is_nan_bits(w, y.dtype))":
     "exp.get(\"any_nan\") and (_is_nan_bits(g, y.dtype) or _is_nan_bits(w, y.dtype)))"},
], ids=["triton-side-alone", "torch-side-alone", "either"])
def test_any_nan_needs_both_planted(tmp_path, plant):
    red(pin_any_nan_needs_both, module_with(pk, plant, tmp_path)._match_torch)


def pin_ulp_nan_either_side(ulp_failures) -> None:
    x = torch.tensor([-1.0, 1.0, 4.0])
    want = pk.round_to([pk._math("log", v) for v in x.double().tolist()], F32)   # NaN (None), 0, log 4
    assert ulp_failures("log", x, pk._from_bits([0x7FC00123] + want[1:], F32), 0) == []
    for y in ([0x3F800000] + want[1:], [0x7FC00123, 0x7FC00000, want[2]]):       # a number for NaN; NaN for 0
        msgs = ulp_failures("log", x, pk._from_bits(y, F32), 0)
        assert len(msgs) == 1, (y, msgs)
        msg = msgs[0]
        assert msg.startswith("log: 1 results are more than 0 ulps") and "NaN-ness differs" in msg, msg


def test_ulp_nan_either_side():
    pin_ulp_nan_either_side(pk.ulp_failures)


@pytest.mark.parametrize("plant", [
    {"if w is None or _is_nan_bits(g, t.dtype):\n                if (w is None) != _is_nan_bits(g, t.dtype):":
     "if w is None or _is_nan_bits(g, t.dtype):\n                if False:"},
    {"if w is None or _is_nan_bits(g, t.dtype):\n                if (w is None) != _is_nan_bits(g, t.dtype):":
     "if w is None or _is_nan_bits(g, t.dtype):\n                if w is None and not _is_nan_bits(g, t.dtype):"},
], ids=["no-side", "one-side"])
def test_ulp_nan_either_side_planted(tmp_path, plant):
    red(pin_ulp_nan_either_side, module_with(pk, plant, tmp_path).ulp_failures)
