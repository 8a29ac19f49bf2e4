"""bench/sampling.py on a small CPU vocabulary (Triton's interpreter): both tables run, the fused
kernel's bits equal the torch path's, and the --chunks sweep finds every split of a row giving
the bits of one program per row (the bench exits 3 otherwise), so the script cannot rot between
GPU runs. No timing is asserted."""

import os
import re
import subprocess
import sys

from tests.conftest import REPO


def test_sampling_bench_runs_on_cpu():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    run = lambda *a: subprocess.run([sys.executable, "bench/sampling.py", "--vocab", "2100", "--batches", "2",  # noqa: E731
                                     "--repeat", "1", *a], cwd=REPO, env=env, capture_output=True, text=True,
                                    timeout=600)
    plain, sweep = run(), run("--chunks", "1,2")
    for proc in (plain, sweep):
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [line.split()[0] for line in plain.stdout.splitlines()[2:]] == ["seeded", "greedy"], plain.stdout
    lines = sweep.stdout.splitlines()[1:]
    assert [line.split()[:2] for line in lines] == [["seeded", "2"], ["greedy", "2"], ["forced", "2"]], sweep.stdout
    for line in lines:                                   # chunks 1 (the baseline, ratio 1.0) and 2
        cells = re.findall(r"([0-9.]+)ms \(\s*([0-9.]+)x\)", line)
        assert len(cells) == 2 and cells[0][1] == "1.0", line
