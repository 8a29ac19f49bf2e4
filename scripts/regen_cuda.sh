#!/usr/bin/env bash
# Record the CUDA goldens of every spec that runs on one GPU, for both engine backends and both
# dtype policies, with `lockstep regen` (two identical runs per spec, expectations held), in
# parallel shards that share the GPU. Topology specs need one GPU per rank and are left to a
# multi-GPU machine.
#
#   [BACKENDS="torch triton"] [DTYPES="fp32 bf16"] [SPECS="generate/* ..."] scripts/regen_cuda.sh [SHARDS] [OUT_TAR]
#
# `lockstep regen` holds the golden folder exclusively while it runs, so each shard records into
# its own copy of golden/ and the new platform folders are copied back once every shard is done.
# OUT_TAR (optional) receives golden/cuda-* as a .tar.gz, with the regen logs beside it.
set -uo pipefail
cd "$(dirname "$0")/.."
shards=${1:-8}
out=${2:-}
export PYTHONUNBUFFERED=1
if [ -n "${SPECS:-}" ]; then
  ids=$(for s in $SPECS; do echo "$s"; done)
else
  ids=$(find specs -name '*.yaml' | sed 's|^specs/||; s|\.yaml$||' | sort | grep -v '^topology/')
fi
work=$(mktemp -d)
logs=$work/logs
mkdir -p "$logs"
status=0
for dtype in ${DTYPES:-fp32 bf16}; do
  for backend in ${BACKENDS:-torch triton}; do
    pids=()
    stamp=$work/stamp-$dtype-$backend && touch "$stamp" && sleep 1
    for ((s = 0; s < shards; s++)); do
      mine=$(echo "$ids" | awk -v n="$shards" -v s="$s" 'NR % n == s')
      [ -n "$mine" ] || continue
      rm -rf "$work/g$s" && cp -a golden "$work/g$s"      # -a: keep mtimes (the copy-back below)
      # shellcheck disable=SC2086
      python3 -m lockstep regen --golden "$work/g$s" --device cuda --dtype "$dtype" --backend "$backend" $mine \
        > "$logs/$dtype-$backend-$s.log" 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || status=1; done
    # copy back only what this pass wrote (newer than its stamp): a whole-folder copy would put back
    # the stale copies of goldens another run (another pass, or a concurrent call) has re-recorded
    for ((s = 0; s < shards; s++)); do
      [ -d "$work/g$s" ] && (cd "$work/g$s" && find . -type f -newer "$stamp" -print0) |
        while IFS= read -r -d '' f; do mkdir -p "golden/$(dirname "$f")" && cp "$work/g$s/$f" "golden/$f"; done
    done
    cat "$logs/$dtype-$backend"-*.log | grep -v -E '^(unchanged|new|changed) ' | grep -v '^    ' || true
    echo "$dtype $backend: $(cat "$logs/$dtype-$backend"-*.log | grep -c -E '^(new|changed) .*\[written\]') written," \
         "$(cat "$logs/$dtype-$backend"-*.log | grep -c '^unchanged ') unchanged," \
         "$(cat "$logs/$dtype-$backend"-*.log | grep -c '^refused ') refused"
  done
done
if [ -n "$out" ]; then
  tar czf "$out" golden/cuda-* && cat "$logs"/*.log > "$(dirname "$out")/regen_cuda.log"
fi
exit $status
