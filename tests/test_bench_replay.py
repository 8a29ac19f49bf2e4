"""bench/replay.py --shape on the tiny shape, on the CPU: the in-memory path (random weights built on
the device, no checkpoint file) must run, print its figures and find every teacher-forced step
bitwise equal to the recording made at another chunk and group (D3), so the script cannot rot
between GPU runs. No timing is asserted."""

import os
import subprocess
import sys

from tests.conftest import REPO

COMMAND = ["bench/replay.py", "--shape", "tiny", "--device", "cpu", "--requests", "3", "--tokens", "5",
           "--prompt", "4", "--chunk", "4", "--max-batch", "2", "--repeat", "1"]


def test_replay_bench_runs_in_memory_on_tiny_cpu():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, *COMMAND], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "random weights built on cpu" in out and "3 requests x 5 tokens, prompt 4" in out
    assert "plain prefill" in out and "every row's logits" in out and "ratio replay / plain prefill:" in out
    assert "15 of 15 steps bitwise to the recording (chunks of 2 x 1)" in out, out
    assert "memory, model build (random weights made and handed over): model " in out, out
    assert "memory, the timed forwards (caches, activations on top): model " in out, out
