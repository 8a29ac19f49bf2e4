"""bench/speculative.py on the tiny shape, on the CPU: it must run, pass its own check (greedy
speculative decoding = greedy generate) and print every figure (no timing is asserted)."""

import os
import subprocess
import sys

from tests.conftest import REPO


def test_speculative_bench_runs_on_tiny_cpu():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "bench/speculative.py", "--tiny", "--batches", "1,2"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "check: greedy speculative_generate = greedy generate" in out and ": ok" in out, out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert [r[0] for r in rows] == ["1", "2"], out
    for r in rows:
        assert r[1].endswith("ms") and r[4].endswith("ms") and "derived:" in r, r
