"""D0, second proof: the CPU reference gives the same bits on CPUs of other vendors and
instruction sets. The same Python, torch and numpy run under qemu-user's emulation of each CPU
model below (its CPUID steers MKL's, SLEEF's, oneDNN's and numpy's own dispatch), and the
fingerprint of every aten op of the reference (harness.fingerprint) must equal the native one.

qemu-user is a Debian package (`apt-get install -y qemu-user`; .ci/run installs it). Without it
the test is skipped on a developer's machine and fails under CI, where it must run."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.fingerprint import first_difference

ROOT = Path(__file__).resolve().parent.parent
# AMD Zen 2 with AVX2; Intel Haswell with AVX2, no AVX-512; Intel Nehalem with SSE4.2 only
# (torch's DEFAULT kernels, MKL's SSE path). The native run is whatever CI's CPU is.
CPU_MODELS = ("EPYC-Rome", "Haswell", "Nehalem")
TIMEOUT = 900


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() not in ("", "0", "false", "no", "off")


def _command(cpu: str | None) -> list[str]:
    base = [sys.executable, "-m", "harness.fingerprint"]
    return base if cpu is None else ["qemu-x86_64", "-cpu", cpu] + base


@pytest.fixture(scope="module")
def fingerprints():
    if shutil.which("qemu-x86_64") is None:
        if _truthy(os.environ.get("CI")):
            pytest.fail("qemu-x86_64 is missing under CI: .ci/run must install qemu-user")
        pytest.skip("qemu-user is not installed (apt-get install -y qemu-user)")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    procs = {cpu: subprocess.Popen(_command(cpu), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
             for cpu in (None,) + CPU_MODELS}
    out = {}
    for cpu, p in procs.items():
        stdout, stderr = p.communicate(timeout=TIMEOUT)
        errors = [ln for ln in stderr.splitlines() if "TCG doesn't support" not in ln]
        assert p.returncode == 0, f"fingerprint under {cpu or 'native'} failed:\n" + "\n".join(errors[-20:])
        out[cpu or "native"] = json.loads(stdout)
    return out


@pytest.mark.parametrize("cpu", CPU_MODELS)
def test_reference_bits_equal_on_an_emulated_cpu(fingerprints, cpu):
    native, other = fingerprints["native"], fingerprints[cpu]
    assert set(native["sections"]) == set(other["sections"])
    assert all(s["trail"] for s in native["sections"].values())          # something ran
    where = first_difference(native, other)
    assert where is None, f"native and emulated {cpu} differ: {where}"
