#!/usr/bin/env bash
# Check the CUDA goldens of every spec on one GPU, for both engine backends and both dtype
# policies, in parallel shards that share the GPU (each shard one `lockstep check` process), and
# print one summary line per pair. The topology specs run their ranks on the same GPU (gloo over
# host copies, docs/topology.md).
#
#   [BACKENDS="torch triton"] [DTYPES="fp32 bf16"] [SPECS="generate/* ..."] [KERNELS=DIR] [DEVICE=cpu] scripts/check_cuda.sh [SHARDS] [LOG_DIR]
#   JOBS=16 [SPECS=...] [KERNELS=DIR] scripts/check_cuda.sh [SHARDS] [LOG_DIR]
#
# JOBS=N (with DTYPES and BACKENDS unset) runs one `lockstep check --device cuda -j N` instead: every
# pair with goldens, one row per golden folder (a spec whose golden is the same under several
# pairs, `shared` or a kernel spec's `cuda-sm90-fp32-triton`, runs once, not under each of the four
# pairs: every golden is still checked) and rows handed to the N workers one at a time (the costly
# specs do not pile up in one shard); one summary line per golden folder. SHARDS is then unused.
#
# Exit status 1 when any shard fails (a mismatch, a crash or a missing golden of a pair that has
# goldens); the failing lines are printed. Each pair's line adds the Triton compile seconds its
# shards' summaries report (summed over the shards). The shards share Triton's cache
# ($TRITON_CACHE_DIR, else ~/.triton/cache) and compile each kernel specialization once
# (kernels/compile_time.py). KERNELS=DIR logs the specializations compiled into DIR and, when DIR
# already holds a log (an earlier run's, on this GPU and Triton), first compiles every one of them
# in parallel (scripts/triton_kernels.py warm), so the shards find them all in the cache.
set -uo pipefail
cd "$(dirname "$0")/.."
shards=${1:-8}
logs=${2:-$(mktemp -d)}
mkdir -p "$logs"
export PYTHONUNBUFFERED=1
export LOCKSTEP_JOBS=1     # the shards are the parallelism: one worker each (16 x 16 CUDA contexts ran out of memory)
if [ -n "${SPECS:-}" ]; then
  ids=$(for s in $SPECS; do echo "$s"; done)
else
  ids=$(find specs -name '*.yaml' | sed 's|^specs/||; s|\.yaml$||' | sort)
fi
if [ -n "${KERNELS:-}" ]; then
  mkdir -p "$KERNELS"
  if compgen -G "$KERNELS/*.jsonl" > /dev/null; then
    python3 scripts/triton_kernels.py warm "$KERNELS" -j "$(nproc)" || true
  fi
  export LOCKSTEP_KERNEL_LOG=$KERNELS
fi
status=0
if [ -n "${JOBS:-}" ] && [ -z "${DTYPES:-}" ] && [ -z "${BACKENDS:-}" ]; then
  # shellcheck disable=SC2086
  LOCKSTEP_JOBS=$JOBS python3 -m lockstep check --device "${DEVICE:-cuda}" -j "$JOBS" $ids > "$logs/all-pairs.log" 2>&1 ||
    status=1
  grep -i -E '^(mismatch|failed|crash|corrupt|stale|missing|incomparable|lockstep: )' "$logs/all-pairs.log" || true
  for folder in $(awk 'toupper($1) ~ /^(PASS|MISMATCH|FAILED|CRASH|CORRUPT|STALE|MISSING|INCOMPARABLE)$/ {print $3}' \
                    "$logs/all-pairs.log" | sort -u); do
    awk -v f="$folder" '$3 == f {s = toupper($1); if (s == "PASS") p++; else if (s == "MISSING" || s == "INCOMPARABLE") m++;
                        else x++} END {printf "golden %s: %d pass, %d failing, %d missing\n", f, p, x, m}' "$logs/all-pairs.log"
  done
  grep -E '^[0-9]+ check' "$logs/all-pairs.log" | tail -1
  if [ -n "${KERNELS:-}" ]; then python3 scripts/triton_kernels.py count "$KERNELS" | sed -n 1p; fi
  exit $status
fi
pids=()
for dtype in ${DTYPES:-fp32 bf16}; do
  for backend in ${BACKENDS:-torch triton}; do
    for ((s = 0; s < shards; s++)); do
      mine=$(echo "$ids" | awk -v n="$shards" -v s="$s" 'NR % n == s')
      [ -n "$mine" ] || continue
      # shellcheck disable=SC2086
      python3 -m lockstep check --device "${DEVICE:-cuda}" --dtype "$dtype" --backend "$backend" $mine \
        > "$logs/$dtype-$backend-$s.log" 2>&1 &
      pids+=($!)
    done
  done
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
for dtype in ${DTYPES:-fp32 bf16}; do
  for backend in ${BACKENDS:-torch triton}; do
    cat "$logs/$dtype-$backend"-*.log | grep -i -E '^(mismatch|failed|crash|corrupt|missing|incomparable|lockstep: )' || true
    echo "$dtype $backend: $(cat "$logs/$dtype-$backend"-*.log | grep -c -i '^pass ') pass," \
         "$(cat "$logs/$dtype-$backend"-*.log | grep -c -i -E '^(mismatch|failed|crash|corrupt) ') failing," \
         "$(cat "$logs/$dtype-$backend"-*.log | grep -c -i -E '^(missing|incomparable) ') missing," \
         "Triton compile $(cat "$logs/$dtype-$backend"-*.log | grep -o -E 'Triton compile [0-9.]+s' |
                           awk '{s += $3} END {printf "%.1fs", s}') over the shards"
  done
done
if [ -n "${KERNELS:-}" ]; then python3 scripts/triton_kernels.py count "$KERNELS" | sed -n 1p; fi
exit $status
