"""bench/moe.py on its tiny CPU shape (Triton's interpreter): it must run, print its tables, and
find the grouped expert kernels giving the same bits in blocks of 16 rows and of the engine's
choice (dense and MXFP4) and with the fast and the exact MXFP4 decode (so the script cannot rot
between GPU runs; packed = dense in the interpreter is tests/kernels/test_grouped_moe.py's). No
timing is asserted."""

import os
import subprocess
import sys

from tests.conftest import REPO


def test_moe_bench_runs_on_tiny_cpu():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "bench/moe.py", "--T", "1", "--grouped-T", "1", "3", "--block-m-T", "2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "dense bf16 and MXFP4 packed weights (same values)" in out
    assert "grouped experts by block size" in out
    rows = [line.split() for line in out.splitlines()]
    assert any(r[:2] == ["experts", "1"] for r in rows), out
    for op in ("gate_up", "down"):
        for T in ("1", "3"):
            row = [r for r in rows if r[:2] == [op, T]]
            assert len(row) == 1 and row[0][-3:] == ["yes,", "yes,", "yes"], (op, T, out)   # bm = 16, fast = exact
        by_size = [r for r in rows if r[:2] == [op, "2"]]
        assert len(by_size) == 1 and by_size[0][-1] == "n/a", (op, out)            # MXFP4 past its cap: not run
