#!/usr/bin/env bash
# Ranks forked from multiprocessing's fork server (engine/launch.py `_rank_context`, gate4) on
# one GPU. The server imports torch only, never CUDA, so a forked rank initialises CUDA itself as
# a spawned one did; this checks it where it matters. Two parts, each under its own time limit so
# the whole stays within 240 s:
#   1. The launcher and the CUDA topology tests with the torch backend: ranks sharing the GPU over
#      gloo-host give the one-device CUDA bits at TP 2, EP 2 and TP 2 x EP 2, a planted wrong order
#      on one rank is caught, a failing rank on a shared GPU is named, traces recorded at one
#      topology replay bitwise at another (tests/parallel/test_launch.py,
#      tests/parallel/test_cuda_topology.py -k "not triton").
#   2. The bit check: the CUDA goldens of topology/* on cuda-bf16 and cuda-fp32 (torch backend),
#      whose ranks run on the GPU (scripts/check_cuda.sh).
# Exit status: non-zero when a test fails or a golden does not pass; a part cut by its time limit
# reports exit 124 in its line and fails the script too.
#
#   scripts/device_gate4.sh                 # from the repository root, on a machine with one GPU
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
echo "== part 1: launcher + CUDA topology tests (torch backend), ranks forked from the fork server"
timeout 130 python3 -m pytest -q -p no:cacheprovider tests/parallel/test_launch.py tests/parallel/test_cuda_topology.py \
    -k "not triton" 2>&1 | tail -15
rc=${PIPESTATUS[0]}
echo "part 1 exit $rc"
[ "$rc" -eq 0 ] || status=1
echo "== part 2: CUDA goldens of topology/* (torch backend, fp32 and bf16)"
SPECS="topology/*" BACKENDS=torch timeout 100 scripts/check_cuda.sh 4 2>&1 | tail -12
rc=${PIPESTATUS[0]}
echo "part 2 exit $rc"
[ "$rc" -eq 0 ] || status=1
echo "== device_gate4: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
