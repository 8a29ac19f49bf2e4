"""D0 on one machine, the cheap extra: the reference's bits do not move with torch's CPU
capability or the thread count (1 or 2).

torch picks its vectorised CPU kernels by `ATEN_CPU_CAPABILITY` (default = the scalar code,
avx2, avx512) and numpy, under Triton's interpreter, by `NPY_DISABLE_CPU_FEATURES`. These
switches do NOT reach MKL's, oneDNN's or other libraries' own dispatch (torch's CPU sqrt went
through MKL and differed across CPUs while agreeing under every switch here), so this is no
proof of D0: tests/test_primitive_oracle.py and tests/test_cross_cpu.py are. Each run is a fresh
process (both switches are read at start-up).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
ORDER = ["default", "avx2", "avx512"]


@lru_cache(maxsize=1)
def capabilities() -> list[str]:
    """The capabilities this CPU can run, from the scalar path up to torch's own choice."""
    best = torch.backends.cpu.get_cpu_capability().lower()
    best = "avx512" if best.startswith("avx512") else best
    return ORDER[:ORDER.index(best) + 1] if best in ORDER else ["default"]


def _numpy_dispatch() -> str:
    """numpy's run-time-dispatched CPU features present here, for NPY_DISABLE_CPU_FEATURES."""
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    return " ".join(f for f in __cpu_dispatch__ if __cpu_features__.get(f))


def _env(capability: str, threads: int) -> dict:
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, OMP_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads), TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    env.pop("NPY_DISABLE_CPU_FEATURES", None)
    if capability == "default" and _numpy_dispatch():
        env["NPY_DISABLE_CPU_FEATURES"] = _numpy_dispatch()    # numpy's baseline code too
    return env


def _run(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)


MATRIX = [(cap, threads) for cap in ORDER for threads in (1, 2)]
# one xdist worker runs the module (pyproject --dist loadgroup): the baseline runs (`_base_*`, each a
# fresh process, cached in this process) are made once a run, not again on the other worker
pytestmark = pytest.mark.xdist_group("capability-matrix")


def _skip_unless_here(capability: str) -> None:
    if capability not in capabilities():
        pytest.skip(f"this CPU cannot run torch's {capability} kernels (best here: {capabilities()[-1]})")


def _fingerprint(env: dict) -> dict:
    r = _run(["-m", "harness.fingerprint", "primitives", "forward", "forward-bf16"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


# The baselines (torch's own capability, 2 threads) are the same process run for every parameter:
# computed once per pytest worker, not once per parameter (each parameter still runs its own fresh
# process under its own switches).
@lru_cache(maxsize=1)
def _base_fingerprint() -> dict:
    return _fingerprint(_env(capabilities()[-1], 2))


@pytest.mark.parametrize("capability, threads", [("default", 1), ("avx2", 2)])
def test_reference_fingerprint_is_the_same_under_every_capability(capability, threads):
    """Every aten op of the primitives and of a forward (fp32 and bf16) against torch's own choice."""
    _skip_unless_here(capability)
    env = _env(capability, threads)
    probe = _run(["-c", "import torch; print(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())"], env)
    cap_seen, threads_seen = probe.stdout.split()
    assert cap_seen.lower().startswith(capability) and int(threads_seen) == threads, probe.stdout + probe.stderr
    from harness.fingerprint import first_difference
    where = first_difference(_base_fingerprint(), _fingerprint(env))
    assert where is None, f"under ATEN_CPU_CAPABILITY={capability}, {threads} thread(s): {where}"


def _generate(env: dict, *extra: str) -> dict:
    r = _run(["-m", "harness", "generate", "--checkpoint", "models/tiny-target", "--prompt-ids", "1,2,3,4,5",
              "--prompt-ids", "9,8,7", "--max-new-tokens", "12", "--logprobs", "--json", *extra], env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@lru_cache(maxsize=None)
def _base_generate(extra: tuple) -> str:
    return json.dumps(_generate(_env(capabilities()[-1], 2), *extra))


@pytest.mark.parametrize("capability, threads", MATRIX)
def test_engine_bits_are_the_same_under_every_capability(capability, threads):
    """Greedy and seeded generations (tokens and logprob bit patterns) against the ones this
    process's default environment gives: D1 across processes, D0 across code paths."""
    _skip_unless_here(capability)
    for extra in ((), ("--seed", "7", "--temperature", "0.9", "--top-p", "0.9")):
        assert _generate(_env(capability, threads), *extra) == json.loads(_base_generate(extra))
