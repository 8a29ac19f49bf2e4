#!/usr/bin/env bash
# Issue 38 (branch portable) on one H200: the CPU reference's speed-ups keep every CUDA golden of
# the torch backend. Run from the repository root; meant to finish in <= 240 s (8 shards per dtype).
#
# What changed runs on a GPU too when the torch ops table is used there: kernels.portable's
# tree_sum / matmul_nt (in-place levels, one reused product buffer, the last level added with
# out=), kernels.mxfp4.dequantize (two gathers), engine.experts.experts_per_row (experts decoded
# once per call, the down chunks in one batched matmul) and the torch attention's merged exp. Every
# element keeps its operations, so the CUDA goldens must pass unchanged; this checks it:
#
#   GOLDENS  scripts/check_cuda.sh on the torch backend, fp32 and bf16, every spec with CUDA goldens
#            (generate, speculative, prefix-cache, layer_ids, topology, draft, coins) and the
#            shared ones (mxfp4 decode, primitives, verify, layer_ids, coins).
#
# Exit 1 when any check fails (a mismatch, a crash, a corrupt golden); the failing lines and one
# summary line per dtype are printed.
set -uo pipefail
cd "$(dirname "$0")/.."
echo "== portable: the torch backend's CUDA goldens (fp32, bf16) =="
start=$(date +%s)
BACKENDS=torch scripts/check_cuda.sh "${SHARDS:-8}"
status=$?
echo "== portable: $(( $(date +%s) - start )) s, exit $status ($([ $status -eq 0 ] && echo 'all pass: the bits are unchanged' || echo 'BIT CHECK FAILED')) =="
exit $status
