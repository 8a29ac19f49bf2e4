#!/usr/bin/env bash
# Record the CUDA goldens of every spec that runs on one GPU, for both engine backends, with
# `lockstep regen` (two identical runs per spec, expectations held), in parallel shards that
# share the GPU. Topology specs need one GPU per rank and are left to a multi-GPU machine.
#
#   [BACKENDS="torch triton"] scripts/regen_cuda.sh [SHARDS] [OUT_TAR]
#
# OUT_TAR (optional) receives golden/cuda-* as a .tar.gz, with the regen logs beside it.
set -uo pipefail
cd "$(dirname "$0")/.."
shards=${1:-8}
out=${2:-}
export PYTHONUNBUFFERED=1
ids=$(find specs -name '*.yaml' | sed 's|^specs/||; s|\.yaml$||' | sort | grep -v '^topology/')
logs=$(mktemp -d)
status=0
for backend in ${BACKENDS:-torch triton}; do
  pids=()
  for ((s = 0; s < shards; s++)); do
    mine=$(echo "$ids" | awk -v n="$shards" -v s="$s" 'NR % n == s')
    # shellcheck disable=SC2086
    python3 -m harness regen --device cuda --backend "$backend" $mine > "$logs/$backend-$s.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  cat "$logs/$backend"-*.log | grep -v -E '^(unchanged|new|changed) ' | grep -v '^    ' || true
  echo "$backend: $(cat "$logs/$backend"-*.log | grep -c -E '^(new|changed) .*\[written\]') written," \
       "$(cat "$logs/$backend"-*.log | grep -c '^unchanged ') unchanged, $(cat "$logs/$backend"-*.log | grep -c '^refused ') refused"
done
if [ -n "$out" ]; then
  tar czf "$out" golden/cuda-* && cat "$logs"/*.log > "$(dirname "$out")/regen_cuda.log"
fi
exit $status
