"""Platforms: what a golden's bits are valid for (DESIGN §2).

A platform is a device kind plus a dtype policy, e.g. `cpu-fp32` or `cuda-sm90-bf16`.
Results that only integer arithmetic and correctly rounded IEEE operations produced are the
same on every platform; their goldens live under the one platform name `shared`.

A platform key names only what the bits depend on (DESIGN §2, D0). The CPU reference is
built to be portable (kernels/portable.py), so `cpu-fp32` should depend on nothing else: not the
CPU model, its instruction set or the thread count. That is proven, not presumed, by
tests/test_primitive_oracle.py and tests/test_cross_cpu.py, and `lockstep doctor` checks it on
any machine. What the other golden folders still
depend on is recorded in each manifest (`bit_dependencies`), and `lockstep check` names the
recorded items that differ from this machine when a golden mismatches:
    cpu-*-triton   Triton's interpreter and numpy (their reductions run our kernels' sums)
    cuda-*         the GPU, torch (which bundles the CUDA runtime and cuBLAS), the CUDA
                   version, the driver and Triton (which compiles the kernels)
"""

from __future__ import annotations

import os
import platform as _py_platform
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy
import torch

import lockstep.kernels._common  # noqa: F401  (before triton, which versions() imports: it picks the interpreter on a CPU)

SHARED = "shared"
DTYPE_POLICIES = ("fp32", "bf16")


@dataclass(frozen=True)
class Platform:
    device: str  # "cpu" or "cuda-sm90"-style: the CUDA arch is part of the platform
    dtype: str  # dtype policy of the engine's compute

    @property
    def name(self) -> str:
        return f"{self.device}-{self.dtype}"

    @property
    def torch_device(self) -> torch.device:
        return torch.device("cpu" if self.device == "cpu" else "cuda")


def detect(device: str | None = None, dtype: str = "fp32") -> Platform:
    """The platform of this process: `device` is "cpu", "cuda" or None (CUDA when available)."""
    if dtype not in DTYPE_POLICIES:
        raise ValueError(f"dtype must be one of {DTYPE_POLICIES}, got {dtype!r}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return Platform("cpu", dtype)
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' was asked for, but torch sees no CUDA device")
        major, minor = torch.cuda.get_device_capability()
        return Platform(f"cuda-sm{major}{minor}", dtype)
    raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")


def device_name(p: Platform) -> str:
    if p.device == "cpu":
        return f"cpu: {_py_platform.processor() or _py_platform.machine()}"
    return f"cuda: {torch.cuda.get_device_name()}"


# The folders and files of the checkout that a run reads: dirt elsewhere (docs, tests, goldens,
# the spec files, whose hash a golden records itself) cannot have changed the bits it records.
READ_BY_A_RUN = ("lockstep/", "kernels/", "engine/", "harness/", "models/", "pyproject.toml")
MAX_DIRTY_LISTED = 20


def lockstep_revision() -> str:
    """The git revision of the lockstep checkout, with '+dirty' when a file a run reads
    (READ_BY_A_RUN) has uncommitted changes; `dirty_paths` names them."""
    rev, dirty = _revision_and_dirt()
    return rev + ("+dirty" if dirty else "")


def dirty_paths() -> list[str]:
    """The uncommitted files among those a run reads (at most MAX_DIRTY_LISTED, then a count)."""
    dirty = _revision_and_dirt()[1]
    more = len(dirty) - MAX_DIRTY_LISTED
    return dirty[:MAX_DIRTY_LISTED] + ([f"… {more} more"] if more > 0 else [])


@lru_cache(maxsize=1)
def _revision_and_dirt() -> tuple[str, list[str]]:
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown", []
    paths = [p for line in status.splitlines() if len(line) > 3 for p in line[3:].split(" -> ")]
    return rev or "unknown", sorted({p.strip('"') for p in paths if p.strip('"').startswith(READ_BY_A_RUN)})


def versions() -> dict:
    import triton

    return {"python": sys.version.split()[0], "torch": torch.__version__, "triton": triton.__version__,
            "triton_interpret": os.environ.get("TRITON_INTERPRET", "0")}


def bit_dependencies(golden_platform: str) -> dict:
    """What the bits of a golden in `golden_platform` depend on besides Lockstep's own code,
    with this machine's values (see the module docstring)."""

    import triton

    if golden_platform.startswith("cuda"):
        return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
                "driver": _cuda_driver(), "triton": triton.__version__}
    if golden_platform.startswith("cpu") and golden_platform.endswith("-triton"):
        return {"triton": triton.__version__, "numpy": numpy.__version__}
    return {}


@lru_cache(maxsize=1)
def _cuda_driver() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.split()
        return out[0] if out else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_description() -> str:
    """'AMD EPYC (AVX-512, AVX512-BF16)': the CPU's name and the vector extensions that steer
    libraries' dispatch (from /proc/cpuinfo; 'unknown CPU' where there is none)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return _py_platform.processor() or "unknown CPU"
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "unknown CPU")
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    ext = [label for flag, label in (("avx512f", "AVX-512"), ("avx512_bf16", "AVX512-BF16"), ("avx2", "AVX2"))
           if flag in flags]
    return f"{name} ({', '.join(ext) or 'no AVX2'})"


def dependency_report(recorded: dict | None, golden_platform: str) -> str:
    """One line for a mismatch: which recorded dependencies differ from this machine's."""
    if recorded is None:
        return "this golden does not record what its bits depend on (recorded before lockstep did)"
    here = bit_dependencies(golden_platform)
    if not recorded and not here:
        return (f"{golden_platform} bits should depend on nothing but Lockstep's code: either the code changed, "
                f"or an operation that follows the CPU slipped into the reference "
                f"(`lockstep doctor` says which ops are not IEEE on this machine)")
    differ = sorted(k for k in set(recorded) | set(here) if recorded.get(k) != here.get(k))
    if not differ:
        listed = ", ".join(f"{k} {v}" for k, v in sorted(here.items()))
        return f"every item these bits depend on matches the recording ({listed}): a change in results"
    rec = ", ".join(f"{k} {recorded.get(k, '(none)')}" for k in differ)
    now = ", ".join(f"{k} {here.get(k, '(none)')}" for k in differ)
    return f"recorded on {rec}; this machine: {now} (a foreign golden may differ for that reason alone)"
