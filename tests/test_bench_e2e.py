"""bench/e2e.py end to end on the tiny shape, on the CPU: it must run, print its table, and find
the engine and HF agreeing on the same weights (so the script cannot rot between GPU runs).
No timing is asserted. Features the engine does not have yet print "n/a (not available: ...)".
"""

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

# --context 16: each decode figure's requests hold 16 tokens (the default 128 made this test prefill
# ~1,200 tokens per dtype and mode, most of its time); 16 is twice the tiny shape's window of 8, so
# the context's prefill and every timed decode step still run past the window, as at 128.
COMMAND = ["bench/e2e.py", "--shape", "tiny", "--device", "cpu", "--batches", "1,2", "--prefill", "16",
           "--context", "16", "--repeat", "1", "--new-tokens", "4", "--generate-batches", "2"]


@pytest.mark.slow      # ~32 CPU s since --context 16 (docs/gate.md)
def test_e2e_bench_runs_on_tiny_cpu():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, *COMMAND], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "command: python3 bench/e2e.py --shape tiny" in out and "copy bandwidth" in out
    assert "| figure | dtype | mode | ours | HF eager |" in out
    for figure in ("decode b=1", "decode b=2", "prefill 16", "generate b=2"):
        for dtype in ("bf16", "mxfp4"):
            for mode in ("deterministic", "fast"):
                assert f"| {figure} | {dtype} | {mode} |" in out, (figure, dtype, mode, out)
    # the portable engine exists today: its prefill figure is a number, not an n/a
    assert any(line.startswith("| prefill 16 | bf16 | deterministic |") and " s |" in line
               for line in out.splitlines()), out
    assert any(line.startswith("| generate b=2 | bf16 | deterministic |") and " tok/s |" in line
               for line in out.splitlines()), out
    assert "generate vs decode step, b=2, bf16 deterministic:" in out
    # the roofline counts the experts a traced engine step routed to, not the uniform expectation
    assert "b=1: 2 experts per layer (routed in a traced engine step)" in out, out
    assert "Traceback" not in proc.stderr, proc.stderr
    for dtype in ("bf16", "mxfp4"):                # each build's peak against the model's bytes
        for mode in ("deterministic", "fast"):
            for stretch in ("build", "figures"):
                line = next((ln for ln in out.splitlines() if ln.startswith(f"  memory, {dtype} {mode} {stretch}")), "")
                assert " MB (weights and buffers); device n/a (cpu); host peak RSS " in line, (dtype, mode, out)
    if importlib.util.find_spec("transformers") is not None:
        mapped = [line for line in out.splitlines() if line.startswith("weights mapped (bf16, deterministic")]
        assert mapped and "max |logit diff|" in mapped[0] and ": OK" in mapped[0], out
        assert "MISMATCH" not in out
