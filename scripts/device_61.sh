#!/usr/bin/env bash
# On one GPU, in one run (under 9 minutes on an H100 with the default limits): how long the whole
# CUDA check (four pairs) spends compiling, cold and warm, and the benches' memory against their
# model's bytes at the 20b shape in bf16. Each section runs under its own time limit and prints its
# start time, wall time, Triton compile seconds and kernel specializations (RESULT lines):
#   cold    the whole check with an empty Triton cache ($TRITON_CACHE_DIR), logging every
#           specialization compiled (KERNELS=…: scripts/check_cuda.sh)
#   warm    the whole check again on that cache (warmed's, when warmed ran)
#   bench   bench/e2e.py, bench/speculative.py, bench/replay.py at the 20b shape in bf16, short runs:
#           their "memory" lines (peak device memory and host RSS against the model's bytes)
#   warmed  (not in the default) a second empty cache: scripts/triton_kernels.py warm compiles each
#           specialization of cold's kernel log once, in parallel, then the whole check; needs cold
#           first (in the same run, or WORK= a folder that holds kernels-cold/)
#
#   PYTHONPATH=$PWD scripts/device_61.sh [SECTION ...]      # from the repository root; default: cold warm bench
#   DEVICE=cpu PYTHONPATH=$PWD scripts/device_61.sh         # the CPU smoke path: a few specs, tiny shapes
#
# Limits in seconds (environment): COLD_S=240 WARM_S=110 E2E_S=80 SPEC_S=55 REPLAY_S=35 (520 s in
# all; the issue's targets: cold <= 180 s, warm <= 90 s), WARMUP_S=40 WARMED_S=90; SHARDS=4
# (check_cuda.sh's shards per pair: 16 processes; JOBS=N: its one `check -j N` instead, every golden
# once); RESULT lines count the rows passed, failing and missing; SPECS, DTYPES, BACKENDS as check_cuda.sh takes
# them; WORK=DIR keeps the caches, logs and kernel logs (default: a temporary folder, printed). With
# $OUT set (the device tool's folder) the logs, kernel logs and bench outputs go to
# $OUT/device_61.tgz (one file: the tool brings back a few). A section cut by its limit says so
# (exit 124) and the next one still runs.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=${PYTHONPATH:-$PWD}
export PYTHONUNBUFFERED=1                # a bench cut by its limit still leaves the lines it printed
DEVICE=${DEVICE:-cuda}
SHARDS=${SHARDS:-$([ "$DEVICE" = cpu ] && echo 1 || echo 4)}
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
sections=${*:-cold warm bench}
if [ "$DEVICE" = cpu ]; then             # the smoke path: small enough for a 2-core CPU
  export SPECS=${SPECS:-"coins/known-answers kernels/attention-all-masked"} DTYPES=${DTYPES:-fp32} BACKENDS=${BACKENDS:-triton}
  shape=tiny
else
  shape=20b
fi
status=0

stamp() { date -u +%H:%M:%S; }
now() { date +%s.%N; }

row_counts() {        # LOGDIR: the rows the shards reached, passed and failed (a shard cut by a limit counts what it printed)
  local logs=$1
  echo "pass=$(cat "$logs"/*.log 2>/dev/null | grep -c -i '^pass ')" \
       "failing=$(cat "$logs"/*.log 2>/dev/null | grep -c -i -E '^(mismatch|failed|crash|corrupt|stale) ')" \
       "missing=$(cat "$logs"/*.log 2>/dev/null | grep -c -i -E '^(missing|incomparable) ')"
}

section_line() {      # NAME START RC LOGDIR KERNELS: one line of figures for a check section
  local name=$1 start=$2 rc=$3 logs=$4 kernels=$5 wall
  wall=$(awk -v a="$start" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}')
  echo "-- $name: wall ${wall}s, exit $rc$([ "$rc" = 124 ] && echo ' (cut by its time limit)')"
  grep -h -E '^[0-9]+ (check|spec)' "$logs"/*.log 2>/dev/null | sed 's/^/   shard: /' | head -20
  grep -h -i -E '^(mismatch|failed|crash|corrupt) ' "$logs"/*.log 2>/dev/null | sed 's/^/   FAILING: /' | head -20
  python3 scripts/triton_kernels.py count "$kernels" > "$kernels.txt"
  head -1 "$kernels.txt" | sed 's/^/   kernels: /'
  echo "RESULT $name wall_s=$wall exit=$rc $(row_counts "$logs") $(python3 scripts/triton_kernels.py count "$kernels" --fields)"
}

check_section() {     # NAME CACHE LIMIT: the whole check (check_cuda.sh) on Triton cache CACHE
  local name=$1 cache=$2 limit=$3 start rc
  echo "== $(stamp) $name: the whole check on $DEVICE (Triton cache $cache, limit ${limit}s)"
  mkdir -p "$cache" "$work/kernels-$name"
  start=$(now)
  TRITON_CACHE_DIR=$cache KERNELS=$work/kernels-$name DEVICE=$DEVICE timeout "$limit" \
    scripts/check_cuda.sh "$SHARDS" "$work/logs-$name" 2>&1 | tail -20 | sed 's/^/   /'
  rc=${PIPESTATUS[0]}
  section_line "$name" "$start" "$rc" "$work/logs-$name" "$work/kernels-$name"
  [ "$rc" -eq 0 ] || status=1
}

bench_run() {         # NAME LIMIT COMMAND...: a bench's memory lines and its tail
  local name=$1 limit=$2 start rc
  shift 2
  echo "== $(stamp) bench $name (limit ${limit}s): $*"
  start=$(now)
  TRITON_CACHE_DIR=$cache_for_bench timeout "$limit" "$@" > "$work/bench-$name.txt" 2>&1
  rc=$?
  grep -E '^ *memory, ' "$work/bench-$name.txt" | sed 's/^ */   /'
  grep -v -E '^ *memory, ' "$work/bench-$name.txt" | tail -4 | cut -c1-300 | sed 's/^/   | /'
  echo "RESULT bench-$name wall_s=$(awk -v a="$start" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}') exit=$rc"
  [ "$rc" -eq 0 ] || status=1
}

echo "== $(stamp) device_61 on $DEVICE: sections: $sections; work folder $work"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name())"
[ "$DEVICE" = cpu ] || nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
cache_for_bench=$work/cache-cold
for s in $sections; do
  case $s in
    cold)
      rm -rf "$work/cache-cold" "$work/kernels-cold"
      check_section cold "$work/cache-cold" "${COLD_S:-240}" ;;
    warmed)
      rm -rf "$work/cache-warmed" "$work/kernels-warmed"
      mkdir -p "$work/cache-warmed"
      echo "== $(stamp) warm-up: every specialization of cold's log, once, in parallel (limit ${WARMUP_S:-40}s)"
      start=$(now)
      TRITON_CACHE_DIR=$work/cache-warmed timeout "${WARMUP_S:-40}" \
        python3 scripts/triton_kernels.py warm "$work/kernels-cold" -j "$(nproc)" > "$work/warm-up.txt" 2>&1
      rc=$?
      tail -8 "$work/warm-up.txt" | sed 's/^/   /'
      echo "RESULT warm-up wall_s=$(awk -v a="$start" -v b="$(now)" 'BEGIN {printf "%.1f", b - a}') exit=$rc"
      check_section warmed "$work/cache-warmed" "${WARMED_S:-90}"
      cache_for_bench=$work/cache-warmed ;;
    warm)
      cache=$work/cache-warmed
      [ -d "$cache" ] || cache=$work/cache-cold
      rm -rf "$work/kernels-warm"
      check_section warm "$cache" "${WARM_S:-110}"
      cache_for_bench=$cache ;;
    bench)
      if [ "$DEVICE" = cpu ]; then
        e2e=(--shape tiny --device cpu --batches 1 --prefill 0 --context 16 --repeat 1 --new-tokens 0 --no-hf)
        spec=(--tiny --batches 1)
        replay=(--shape tiny --device cpu --requests 2 --tokens 4 --prompt 4 --chunk 4 --max-batch 2 --repeat 1)
      else
        e2e=(--shape 20b --dtype bf16 --modes deterministic --batches 1 --prefill 0 --context 32 --repeat 2
             --new-tokens 0 --no-hf)
        spec=(--shape 20b --batches 1 --context 32 --repeat 2 --new-tokens 8)
        replay=(--shape 20b --requests 2 --tokens 16 --prompt 16 --chunk 16 --max-batch 2 --repeat 1)
      fi
      bench_run e2e "${E2E_S:-80}" python3 bench/e2e.py "${e2e[@]}"
      bench_run speculative "${SPEC_S:-55}" python3 bench/speculative.py "${spec[@]}"
      bench_run replay "${REPLAY_S:-35}" python3 bench/replay.py "${replay[@]}" ;;
    *)
      echo "device_61: unknown section $s (cold, warmed, warm, bench)"; status=2 ;;
  esac
done
if [ -d "$work/kernels-cold" ]; then
  echo "== what multiplies cold's specializations (scripts/triton_kernels.py count --varying; the first 80 lines)"
  python3 scripts/triton_kernels.py count "$work/kernels-cold" --varying > "$work/varying-cold.txt"
  head -80 "$work/varying-cold.txt" | cut -c1-240
fi
if [ -n "${OUT:-}" ]; then            # the device tool brings back what is under $OUT: logs, not caches
  (cd "$work" && tar czf "$OUT/device_61.tgz" --ignore-failed-read logs-* kernels-* ./*.txt 2>/dev/null)
fi
echo "== $(stamp) device_61: $([ $status -eq 0 ] && echo PASS || echo FAIL) (the RESULT lines above; work folder $work)"
exit $status
