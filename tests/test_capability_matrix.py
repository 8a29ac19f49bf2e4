"""D0 on one machine, the cheap extra: the reference's bits do not move with torch's CPU
capability or the thread count (1 or 2).

torch picks its vectorised CPU kernels by `ATEN_CPU_CAPABILITY` (default = the scalar code,
avx2, avx512) and numpy, under Triton's interpreter, by `NPY_DISABLE_CPU_FEATURES`. These
switches do NOT reach MKL's, oneDNN's or other libraries' own dispatch (torch's CPU sqrt went
through MKL and differed across CPUs while agreeing under every switch here), so this is no
proof of D0: tests/test_primitive_oracle.py and tests/test_cross_cpu.py are. Each environment
runs in a fresh process of its own (both switches are read at start-up), the baseline in another.
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


MATRIX = [(cap, threads) for cap in ORDER for threads in (1, 2)]
FINGERPRINTED = [("default", 1), ("avx2", 2)]
# one xdist worker runs the module (pyproject --dist loadgroup): each environment's process, and the
# baseline's, runs once a run (cached in this process), not again on the other worker
pytestmark = pytest.mark.xdist_group("capability-matrix")

# One fresh process an environment (both switches are read at start-up) does all the tests ask of
# that environment, in one order: it reports the capability and thread count torch took, runs
# `harness generate` greedy and seeded (the CLI's own entry point, its JSON read back), then the
# fingerprint where a test compares one (last: it sets one thread). Its torch and harness imports
# (~2 CPU s a process) are then paid 7 times a run on an AVX-512 machine, not 19.
GENERATE = ["generate", "--checkpoint", "models/tiny-target", "--prompt-ids", "1,2,3,4,5", "--prompt-ids", "9,8,7",
            "--max-new-tokens", "12", "--logprobs", "--json"]
SAMPLINGS = [[], ["--seed", "7", "--temperature", "0.9", "--top-p", "0.9"]]
_PROCESS = """
import contextlib, io, json, sys
import torch
from lockstep.harness.cli import main
generate, samplings, fingerprinted = json.loads(sys.argv[1])
out = {"capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(), "generate": []}
for extra in samplings:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(generate + extra)
    if code:
        sys.exit(f"harness generate {extra} exited {code}")
    out["generate"].append(json.loads(printed.getvalue()))
if fingerprinted:
    from lockstep.harness.fingerprint import fingerprint
    out["fingerprint"] = fingerprint(("primitives", "forward", "forward-bf16"))
json.dump(out, sys.stdout)
"""


@lru_cache(maxsize=None)
def _process(capability: str, threads: int, fingerprinted: bool, baseline: bool = False) -> dict:
    """The environment's results, from its own fresh process (`baseline`: the baseline's process,
    another one even where its switches are a parameter's). Checked: torch took the switches."""
    env = _env(capability, threads)
    r = subprocess.run([sys.executable, "-c", _PROCESS, json.dumps([GENERATE, SAMPLINGS, fingerprinted])], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["capability"].lower().startswith(capability) and out["threads"] == threads, (out["capability"],
                                                                                           out["threads"])
    return out


def _skip_unless_here(capability: str) -> None:
    if capability not in capabilities():
        pytest.skip(f"this CPU cannot run torch's {capability} kernels (best here: {capabilities()[-1]})")


def _baseline() -> dict:
    """torch's own capability, 2 threads: the process every parameter is compared with."""
    return _process(capabilities()[-1], 2, True, baseline=True)


@pytest.mark.parametrize("capability, threads", FINGERPRINTED)
def test_reference_fingerprint_is_the_same_under_every_capability(capability, threads):
    """Every aten op of the primitives and of a forward (fp32 and bf16) against torch's own choice."""
    _skip_unless_here(capability)
    from lockstep.harness.fingerprint import first_difference
    where = first_difference(_baseline()["fingerprint"], _process(capability, threads, True)["fingerprint"])
    assert where is None, f"under ATEN_CPU_CAPABILITY={capability}, {threads} thread(s): {where}"


@pytest.mark.parametrize("capability, threads", MATRIX)
def test_engine_bits_are_the_same_under_every_capability(capability, threads):
    """Greedy and seeded generations (tokens and logprob bit patterns) against the baseline
    process's: D1 across processes, D0 across code paths."""
    _skip_unless_here(capability)
    got = _process(capability, threads, (capability, threads) in FINGERPRINTED)["generate"]
    assert len(got) == len(SAMPLINGS) and got == _baseline()["generate"]
