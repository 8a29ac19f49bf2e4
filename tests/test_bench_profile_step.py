"""bench/profile_step.py on the tiny shape, on the CPU: a decode step's profile and the generate
split run and print their lines (so the script cannot rot between GPU runs). No timing is asserted."""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

BASE = [sys.executable, "bench/profile_step.py", "--shape", "tiny", "--device", "cpu", "--backend", "torch",
        "--dtype", "mxfp4", "--top", "3"]


@pytest.mark.parametrize("extra, expected", [
    (["--batch", "2"], "tiny mxfp4 batch 2 backend torch:"),
    (["--batch", "2", "--generate", "3"], "tiny mxfp4 generate b=2, 3 new tokens after 128 prompt tokens:"),
])
def test_profile_step_runs_on_tiny_cpu(extra, expected):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(BASE + extra, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert expected in proc.stdout, proc.stdout
    if "--generate" in extra:
        assert "x the captured step" in proc.stdout and "the GPU waiting" in proc.stdout, proc.stdout
