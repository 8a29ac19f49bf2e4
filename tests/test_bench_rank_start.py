"""bench/rank_start.py on the CPU: the phases of a topology's ranks run and print their row (so the
script cannot rot between GPU runs). No timing is asserted."""

import os
import subprocess
import sys

from tests.conftest import REPO


def test_rank_start_runs_on_the_cpu():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "bench/rank_start.py", "--device", "cpu", "--repeat", "1",
                           "--topologies", "1,2"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "in one process (load + generate, no ranks):" in proc.stdout, proc.stdout
    row = [line for line in proc.stdout.splitlines() if line.startswith("| tp=1 ep=2 |")]
    assert len(row) == 1 and row[0].count(" s |") == 4 and row[0].endswith("x |"), proc.stdout


def test_rank_start_refuses_a_bad_topology():
    proc = subprocess.run([sys.executable, "bench/rank_start.py", "--device", "cpu", "--topologies", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--topologies" in proc.stderr, proc.stderr
