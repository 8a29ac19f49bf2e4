"""bench/replay_ranks.py at a small size on the CPU: it records a trace, replays it on 1 and 2
ranks and finds the same report at both, so the script cannot rot. No timing is asserted."""

import os
import subprocess
import sys

from tests.conftest import REPO


def test_replay_ranks_bench_runs_and_the_reports_agree():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "bench/replay_ranks.py", "--requests", "6", "--tokens", "2",
                           "--ranks", "1,2"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "preset tiny, 6 requests x 2 tokens" in proc.stdout
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("free-run replay")]
    assert len(lines) == 2 and all("12 of 12 steps bitwise, report the same" in ln for ln in lines), proc.stdout
