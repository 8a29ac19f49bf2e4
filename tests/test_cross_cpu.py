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

from lockstep.harness.fingerprint import first_difference

ROOT = Path(__file__).resolve().parent.parent
# Which edge each emulated CPU is for (qemu 7.2's TCG emulates up to AVX2, no AVX-512: the AVX-512
# paths, e.g. torch's AVX512 kernels, are the native run's, on a CPU that has them as CI's does):
#   EPYC-Rome  AVX2 + FMA on an AMD CPUID: torch's AVX2 kernels where libraries that ask the vendor
#              pick their AMD paths;
#   Haswell    AVX2 + FMA on an Intel CPUID: the same torch kernels, the Intel paths. The two are
#              not one: under `qemu-x86_64 -d in_asm` (every translated block, mapped to library
#              and offset) a fingerprint run translated 250 blocks on Haswell that it did not on
#              EPYC-Rome and 155 the other way, in glibc's loader and string functions, OpenBLAS,
#              libc10, libtorch_cpu and OpenSSL, where two Haswell runs differ in none
#              (docs/history/gate.md, "Measured by cross6");
#   Nehalem    SSE4.2 only, no AVX: torch's DEFAULT (scalar and SSE) kernels, every library's SSE path.
CPU_MODELS = ("EPYC-Rome", "Haswell", "Nehalem")
TIMEOUT = 900


def _truthy(v: str | None) -> bool:
    return (v or "").strip().lower() not in ("", "0", "false", "no", "off")


def _command(cpu: str | None) -> list[str]:
    base = [sys.executable, "-m", "lockstep.harness.fingerprint"]
    return base if cpu is None else ["qemu-x86_64", "-cpu", cpu] + base


def _fingerprint(cpu: str | None) -> dict:
    """The fingerprint computed in a fresh process, natively (cpu None) or under qemu's `cpu`."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    p = subprocess.run(_command(cpu), cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    errors = [ln for ln in p.stderr.splitlines() if "TCG doesn't support" not in ln]
    assert p.returncode == 0, f"fingerprint under {cpu or 'native'} failed:\n" + "\n".join(errors[-20:])
    return json.loads(p.stdout)


# Each emulated CPU is computed by its own test, so each is paid once in the whole run: a module
# fixture computing all three was set up again by every pytest-xdist worker that ran one of the
# tests (twice under `pytest -n 2`, ~400 s of emulation each). The native fingerprint (seconds)
# is computed once per worker.
@pytest.fixture(scope="module")
def native():
    if shutil.which("qemu-x86_64") is None:
        if _truthy(os.environ.get("CI")):
            pytest.fail("qemu-x86_64 is missing under CI: .ci/run must install qemu-user")
        pytest.skip("qemu-user is not installed (apt-get install -y qemu-user)")
    return _fingerprint(None)


@pytest.mark.slow      # ~35 s of CPU each under qemu (docs/gate.md)
@pytest.mark.parametrize("cpu", CPU_MODELS)
def test_reference_bits_equal_on_an_emulated_cpu(native, cpu):
    other = _fingerprint(cpu)
    assert set(native["sections"]) == set(other["sections"])
    assert all(s["trail"] for s in native["sections"].values())          # something ran
    where = first_difference(native, other)
    assert where is None, f"native and emulated {cpu} differ: {where}"


def test_a_one_bit_difference_is_found(monkeypatch):
    """Planted: an emulated CPU that got one input bit of the primitives section differently (the
    last element of the tensor, so a hash that read less than all of each output would miss it)."""
    from lockstep.harness import fingerprint

    clean = fingerprint.fingerprint(("primitives",))
    real = fingerprint._primitive_inputs

    def flipped():
        x = real()
        x.numpy().view("int64")[-1] ^= 1        # through numpy: no torch op, so the same op sequence
        return x

    monkeypatch.setattr(fingerprint, "_primitive_inputs", flipped)
    planted = fingerprint.fingerprint(("primitives",))
    assert clean["sections"]["primitives"]["ops"] == planted["sections"]["primitives"]["ops"]
    where = first_difference(clean, planted)
    assert where is not None and where.startswith("primitives: op "), where
