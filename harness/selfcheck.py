"""The harness checks its own judge before it judges anything.

A comparator that called -0.0 equal to 0.0, or one NaN payload equal to another, or a golden
loader that took a golden recorded for another platform, would pass every spec: `lockstep check`
would be green because it had stopped looking. So `check` first feeds the comparator and the
loader it is about to use pairs whose verdict is known, and refuses to run any spec (an internal
error, exit 1) when one comes back wrong. It takes milliseconds.

The functions are passed in, not imported here, so the check exercises exactly what the runner
calls (harness.runner.self_check passes its own references).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch


class SelfCheckFailed(Exception):
    """The comparator or the golden loader gave a wrong verdict on a pair whose verdict is known."""


def _f32(*bits: int) -> torch.Tensor:
    return torch.tensor([b - (1 << 32) if b >= 1 << 31 else b for b in bits], dtype=torch.int32).view(torch.float32)


def _bf16(*bits: int) -> torch.Tensor:
    return torch.tensor([b - (1 << 16) if b >= 1 << 15 else b for b in bits], dtype=torch.int16).view(torch.bfloat16)


def _f64(*bits: int) -> torch.Tensor:
    return torch.tensor([b - (1 << 64) if b >= 1 << 63 else b for b in bits], dtype=torch.int64).view(torch.float64)


# (what the pair is, expected, actual): tensors that differ in bits, so the comparator must say so.
# Each difference sits in the last element, after equal ones, so a comparator that looked at the
# first element only, or at values instead of bits, is caught too.
DIFFERENT_TENSORS = [
    ("fp32 -0.0 and 0.0", _f32(0x3F800000, 0x80000000), _f32(0x3F800000, 0x00000000)),
    ("bf16 -0.0 and 0.0", _bf16(0x3F80, 0x8000), _bf16(0x3F80, 0x0000)),
    ("fp64 -0.0 and 0.0", _f64(0x8000000000000000), _f64(0x0)),
    ("two fp32 quiet NaN payloads", _f32(0x7FC00000, 0x7FC00000), _f32(0x7FC00000, 0x7FC00001)),
    ("fp32 NaNs of opposite sign", _f32(0x7FC00000), _f32(0xFFC00000)),
    ("an fp32 signalling and a quiet NaN", _f32(0x7F800001), _f32(0x7FC00001)),
    ("two bf16 NaN payloads", _bf16(0x7FC0), _bf16(0x7FC1)),
    ("adjacent fp32 values 1.0 and 1.0 + 2^-23", _f32(0x3F800000), _f32(0x3F800001)),
    ("adjacent fp32 values 0 and the smallest subnormal", _f32(0x0), _f32(0x1)),
    ("the largest fp32 and +inf", _f32(0x7F7FFFFF), _f32(0x7F800000)),
    ("adjacent bf16 values 1.0 and 1.0078125", _bf16(0x3F80), _bf16(0x3F81)),
    ("int64 2^53 and 2^53 + 1", torch.tensor([2**53]), torch.tensor([2**53 + 1])),
    ("fp32 and bf16 zeros (dtype)", torch.zeros(2), torch.zeros(2, dtype=torch.bfloat16)),
    ("shapes [2] and [1, 2]", torch.zeros(2), torch.zeros(1, 2)),
]
# Bit-identical pairs the comparator must call equal (so it compares bits, not values or identity).
EQUAL_TENSORS = [
    ("an fp32 NaN payload and itself", _f32(0x7FC00001, 0x80000000), _f32(0x7FC00001, 0x80000000)),
    ("a bf16 NaN payload and itself", _bf16(0x7FC1), _bf16(0x7FC1)),
]
# JSON-like data (as a manifest reads back): pairs that differ, and pairs that are the same.
DIFFERENT_DATA = [
    ("-0.0 and 0.0 in data", {"x": [1.0, -0.0]}, {"x": [1.0, 0.0]}),
    ("adjacent floats in data", {"x": 1.0}, {"x": 1.0000000000000002}),
    ("the integer 1 and the float 1.0 in data", {"x": [1]}, {"x": [1.0]}),
    ("true and 1 in data", {"x": [True]}, {"x": [1]}),
    ("integers 2^53 and 2^53 + 1 in data", {"x": 2**53}, {"x": 2**53 + 1}),
    ("a list and its reverse in data", {"x": [1, 2]}, {"x": [2, 1]}),
]
EQUAL_DATA = [
    ("a NaN in data and itself", {"x": [float("nan"), -0.0]}, {"x": [float("nan"), -0.0]}),
]


def check_comparator(diff_tensors, diff_data) -> list[str]:
    """The wrong verdicts of `diff_tensors` / `diff_data` on the known pairs ([] when all are right)."""
    wrong = []
    for what, a, b in DIFFERENT_TENSORS:
        if not diff_tensors({"t": a}, {"t": b}):
            wrong.append(f"the comparator calls {what} equal")
    for what, a, b in EQUAL_TENSORS:
        if diff_tensors({"t": a}, {"t": b.clone()}):
            wrong.append(f"the comparator calls {what} different")
    if not diff_tensors({"t": torch.zeros(1)}, {}) or not diff_tensors({}, {"t": torch.zeros(1)}):
        wrong.append("the comparator ignores a missing or an unexpected tensor")
    for what, a, b in DIFFERENT_DATA:
        if not diff_data(a, b):
            wrong.append(f"the comparator calls {what} equal")
    for what, a, b in EQUAL_DATA:
        if diff_data(a, b):
            wrong.append(f"the comparator calls {what} different")
    return wrong


def check_loader(store_class, corrupt) -> list[str]:
    """The wrong verdicts of `store_class(root).load` ([] when all are right): a golden written to a
    scratch store must read back bit for bit, and one moved to another platform's or another spec's
    place, or with one byte changed, must raise `corrupt`."""
    wrong = []
    tensors = {"t": _f32(0x80000000, 0x7FC00001, 0x00000001)}
    with tempfile.TemporaryDirectory(prefix="lockstep-selfcheck-") as tmp:
        store = store_class(Path(tmp))
        store.write("cpu-fp32", "selfcheck/a", tensors, {"x": -0.0}, "0" * 64, "selfcheck", {})

        def refused(platform: str, spec_id: str) -> bool:
            try:
                store.load(platform, spec_id)
            except corrupt:
                return True
            return False

        try:
            back = store.load("cpu-fp32", "selfcheck/a")
        except corrupt as e:
            back, _ = None, wrong.append(f"the golden loader refuses a golden it has just written ({e})")
        if back is not None and not torch.equal(back.tensors["t"].view(torch.int32), tensors["t"].view(torch.int32)):
            wrong.append("the golden loader does not give back the bits written (-0.0, a NaN payload, a subnormal)")
        src_t, src_m = store.paths("cpu-fp32", "selfcheck/a")
        for platform, spec_id, what in (("cuda-sm90-fp32", "selfcheck/a", "a golden of another platform"),
                                        ("cpu-fp32", "selfcheck/b", "a golden of another spec")):
            dst_t, dst_m = store.paths(platform, spec_id)
            dst_t.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src_t, dst_t)
            shutil.copyfile(src_m, dst_m)
            if not refused(platform, spec_id):
                wrong.append(f"the golden loader accepts {what} (its manifest names cpu-fp32 selfcheck/a)")
        blob = bytearray(src_t.read_bytes())
        blob[-1] ^= 0x01  # the last byte is tensor data
        src_t.write_bytes(bytes(blob))
        if not refused("cpu-fp32", "selfcheck/a"):
            wrong.append("the golden loader accepts a tensor file with one byte changed")
    return wrong


def verify(diff_tensors, diff_data, store_class, corrupt) -> None:
    """Raise SelfCheckFailed naming every wrong verdict; return quietly when the judge is sound."""
    wrong = check_comparator(diff_tensors, diff_data) + check_loader(store_class, corrupt)
    if wrong:
        raise SelfCheckFailed("lockstep's self-check failed, so no spec was run (its verdict could not be trusted): "
                              + "; ".join(wrong))
