"""Every kernel case the `kernel` spec kind runs (kernels/case.py): each kernels module's CASES,
and the engine paths pinned as kernels (engine.experts' grouped experts, engine.sampling's fused
sampler), whose references are engine code."""

from __future__ import annotations

from lockstep.engine import experts, sampling
from lockstep.kernels.case import KernelCase, kernel_cases


def every_case() -> dict[str, KernelCase]:
    """Name -> case, the kernels' first; a name declared twice is an error, not an override."""
    out: dict[str, KernelCase] = {}
    for case in (*kernel_cases(), *experts.CASES, *sampling.CASES):
        if case.name in out:
            raise ValueError(f"kernel case {case.name!r} is declared twice")
        out[case.name] = case
    return out
