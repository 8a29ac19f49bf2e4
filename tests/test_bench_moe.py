"""bench/moe.py on its tiny CPU shape (Triton's interpreter): it must run, print both tables, and
find the grouped expert kernels giving the same bits with the fast and the exact MXFP4 decode, and
from MXFP4 packed and dense bf16 weights (so the script cannot rot between GPU runs). No timing is
asserted."""

import os
import subprocess
import sys

from tests.conftest import REPO


def test_moe_bench_runs_on_tiny_cpu():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "bench/moe.py", "--T", "1", "--grouped-T", "1", "3"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "MXFP4 packed (fast decode; exact decode) vs dense bf16 weights" in out
    rows = [line.split() for line in out.splitlines()]
    assert any(r[:2] == ["experts", "1"] for r in rows), out
    for op in ("gate_up", "down"):
        for T in ("1", "3"):
            row = [r for r in rows if r[:2] == [op, T]]
            assert len(row) == 1 and row[0][-2:] == ["yes,", "yes"], (op, T, out)     # fast = exact, = bf16
