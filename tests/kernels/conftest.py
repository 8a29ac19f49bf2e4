"""Kernel tests: the one place that says which device the Triton kernels are tested on.

    DEVICE = cuda when torch sees a GPU (kernels compiled), else cpu (Triton's interpreter,
             turned on by kernels/__init__.py).  Override: LOCKSTEP_TEST_DEVICE=cpu|cuda.

On a CUDA machine LOCKSTEP_TEST_DEVICE=cpu also needs TRITON_INTERPRET=1 in the environment
before pytest starts (the kernels read it when they are imported, and the lockstep pytest plugin
imports some before any conftest runs); without it the session stops with a usage error.

Tests build their inputs on the CPU with a seeded torch.Generator (the same values on every
machine) and move them `.to(DEVICE)` before a kernel call; every bitwise comparison is between
tensors produced on the same device. Use the module constant (`from tests.kernels.conftest
import DEVICE`, also for tests/test_coins_kernel.py) or the `device` fixture.
"""

import os

import pytest
import torch

from lockstep.kernels._common import INTERPRET
from tests.engine.conftest import tiny_ckpts  # noqa: F401  (the tiny checkpoint fixture)


def _test_device() -> torch.device:
    want = os.environ.get("LOCKSTEP_TEST_DEVICE", "").strip().lower()
    if not want:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if want not in ("cpu", "cuda"):
        raise pytest.UsageError(f"LOCKSTEP_TEST_DEVICE must be 'cpu' or 'cuda', got {want!r}")
    if want == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("LOCKSTEP_TEST_DEVICE=cuda, but torch sees no CUDA device")
    if want == "cpu" and not INTERPRET:
        raise pytest.UsageError("LOCKSTEP_TEST_DEVICE=cpu runs the kernels in Triton's interpreter: "
                                "set TRITON_INTERPRET=1 too (compiled kernels cannot read CPU tensors)")
    return torch.device(want)


DEVICE = _test_device()


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The device the kernels are tested on (DEVICE)."""
    return DEVICE


@pytest.fixture
def nan_empty(monkeypatch):
    """torch.empty's floating-point tensors come back filled with NaN for the test: a kernel whose
    output is allocated unfilled must store every element itself, or the NaN shows."""
    empty = torch.empty

    def poisoned(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t
    monkeypatch.setattr(torch, "empty", poisoned)
