#!/usr/bin/env bash
# The captured speculative round on one GPU (issue 34 item 2): engine.graphs.RoundGraphs replays
# the round's device-only pieces from CUDA graphs (the draft tree, the verify layout, the verify
# call, a greedy acceptance, the chosen logprobs, the draft extend). Three parts, each labelled,
# each under its own time limit so the whole stays within 240 s:
#   1. GPU tests: captured verify / draft steps / draft extend = the eager calls bit for bit over
#      several rounds, speculative_generate with graphs = without (chain, tree, rejection with an
#      unseeded request, fp32 head; torch and triton), every graph captured (none refused), and a
#      step with a host read refused by the capture and run eagerly
#      (tests/speculative/test_round_graphs.py, tests/engine/test_graphs.py).
#   2. The bit check: every CUDA golden of speculative/* and draft/* on the four pairs
#      (fp32/bf16 x torch/triton), recorded before the round was captured, must still pass.
#   3. bench/speculative.py --batches 1,8 --repeat 5: the round (its forwards replayed) against
#      the captured decode step, and the end-to-end figure at full acceptance.
# Exit status: non-zero when a test fails or a golden does not pass (the bit check); a part cut
# by its time limit is reported as such (exit 124 in its line) and fails the script too.
#
#   scripts/device_round.sh                 # from the repository root, on a machine with one GPU
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
status=0
start=$SECONDS

echo "=== 1. GPU tests (captured = eager, bit for bit) ==="
# the round tests first: test_graphs.py ends with a capture that must be refused
timeout 95 python3 -m pytest -q tests/speculative/test_round_graphs.py tests/engine/test_graphs.py
rc=$?
echo "=== 1. GPU tests: exit $rc ($((SECONDS - start)) s so far) ==="
[ $rc -eq 0 ] || status=1

echo "=== 2. bit check: CUDA goldens of speculative/* and draft/* (all four pairs) ==="
LOCKSTEP_JOBS=8 timeout 85 python3 -m lockstep check --device cuda -j 8 'speculative/*' 'draft/*' | tee /tmp/device_round_check.log
rc=${PIPESTATUS[0]}
echo "=== 2. bit check: exit $rc; $(grep -c -i '^pass ' /tmp/device_round_check.log) pass," \
     "$(grep -c -i -E '^(mismatch|failed|crash|corrupt) ' /tmp/device_round_check.log) failing," \
     "$(grep -c -i -E '^(missing|incomparable) ' /tmp/device_round_check.log) missing ($((SECONDS - start)) s so far) ==="
[ $rc -eq 0 ] || status=1

echo "=== 3. bench/speculative.py --batches 1,8 --repeat 5 (H200, 20b shape, bf16, triton) ==="
timeout $((235 - (SECONDS - start))) python3 bench/speculative.py --batches 1,8 --repeat 5
rc=$?
echo "=== 3. bench: exit $rc ($((SECONDS - start)) s in all) ==="
[ $rc -eq 0 ] || status=1
exit $status
