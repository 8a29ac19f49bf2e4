"""A kernel added the documented way: a module under kernels/ ending in `CASES` (kernels/case.py).
The kernel kind and Lockstep's target find it with no other edit: a spec of it validates, runs
on the target's operation against its torch reference, and a fault planted in it turns the spec
red, named by kernel and shape."""

from __future__ import annotations

import sys

import pytest
import torch

import lockstep.kernels
from lockstep.harness.kinds import kernel as kernel_kind
from lockstep.harness.platform import detect
from lockstep.harness.result import RunContext
from lockstep.harness.specfile import SpecErrors, parse_spec
from lockstep.harness.targets.lockstep import engine, load

MODULE = '''
import torch
from lockstep.kernels import _common  # noqa: F401
import triton
import triton.language as tl

from lockstep.kernels.case import KernelCase


@triton.jit
def _double_kernel(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    ok = i < N
    x = tl.load(x_ptr + r * N + i, mask=ok)
    tl.store(y_ptr + r * N + i, x + x, mask=ok)


def double_triton(x):
    y = torch.empty_like(x)
    _double_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


def double_portable(x):
    return x + x


# --------------------------------------------------------------------------- the kernel spec's case
CASES = (KernelCase(
    name="double", dims=("M", "N"), op=lambda x: double_triton(x),
    inputs=lambda inp, s, d: {"x": d.normal(s["M"], s["N"], scale=inp["scale"])},
    call=lambda op, x, r, offered: op(x["x"][r]), reference=lambda x: double_portable(x["x"]),
    elements=lambda s: 2 * s["M"] * s["N"], note="lockstep.kernels.tiny_double.double_triton"),)
'''

SPEC = ("kind: kernel\ndescription: x + x, rows of 5 in a block of 8\n"
        "inputs: {kernel: double, shape: {M: 3, N: 5}, scale: 3.0}\n"
        "expect: {finite: true, bitwise: true, tolerance: 0.0, batch_invariant: true, reproducible: true}\n")


@pytest.fixture
def tiny_double(tmp_path, monkeypatch):
    """kernels/tiny_double.py, as if written into the repository's kernels/ folder."""
    (tmp_path / "tiny_double.py").write_text(MODULE, encoding="utf-8")
    monkeypatch.setattr(lockstep.kernels, "__path__", [*lockstep.kernels.__path__, str(tmp_path)])
    yield
    sys.modules.pop("lockstep.kernels.tiny_double", None)


def run(spec):
    ctx = RunContext(platform=detect("cpu"))
    return kernel_kind.check(spec, kernel_kind.run(spec, ctx, engine(ctx)))


def test_a_kernel_module_with_its_case_is_run_by_the_kernel_kind(tiny_double):
    assert "double" in kernel_kind.cases()
    assert load().ops["double"].note == "lockstep.kernels.tiny_double.double_triton"    # a target operation
    spec = parse_spec(SPEC, "specs/kernels/double.yaml", "kernels/double")
    assert run(spec) == []
    tiny = sys.modules["lockstep.kernels.tiny_double"]
    x = kernel_kind.kernel_inputs(spec, torch.device("cpu"))
    assert x["x"].dtype == torch.float32 and x["x"].shape == (3, 5)
    assert kernel_kind.reference(spec, x).equal(tiny.double_portable(x["x"]))


def test_a_fault_planted_in_the_new_kernel_turns_its_spec_red(tiny_double, monkeypatch):
    spec = parse_spec(SPEC, "specs/kernels/double.yaml", "kernels/double")
    tiny = sys.modules["lockstep.kernels.tiny_double"]
    monkeypatch.setattr(tiny, "double_triton", lambda x: torch.cat([x[:, :-1] * 2, x[:, -1:]], 1))   # tail not doubled
    fails = run(spec)
    assert fails and fails[0].startswith("lockstep: kernel double [M=3, N=5] fp32: the output differs bitwise")


def test_the_new_kernel_s_dims_and_options_are_validated(tiny_double):
    with pytest.raises(SpecErrors, match="not a dimension of kernel double"):
        parse_spec(SPEC.replace("N: 5}", "N: 5, K: 2}"), "specs/kernels/bad.yaml", "kernels/bad")
    for option, takers in (("sink: 0.0", "attention"), ("col_base: 0", "sampling"), ("mxfp4: true", "experts")):
        with pytest.raises(SpecErrors, match=f"only for kernel {takers}"):
            parse_spec(SPEC.replace("scale: 3.0", f"scale: 3.0, {option}"), "specs/kernels/bad.yaml", "kernels/bad")
    parse_spec(SPEC.replace("scale: 3.0", "scale: 3.0, mxfp4: false"), "specs/kernels/ok.yaml", "kernels/ok")


def test_without_the_module_the_kernel_is_unknown():
    with pytest.raises(SpecErrors, match="expected one of .*'matmul'.*found str 'double'"):
        parse_spec(SPEC, "specs/kernels/double.yaml", "kernels/double")
    assert "double" not in load().ops
