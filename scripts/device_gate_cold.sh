#!/usr/bin/env bash
# The GPU gate against its targets, in one device call (under 10 minutes with the default limits):
# the whole CUDA check (four pairs, 16 processes: scripts/check_cuda.sh 4) on an empty Triton cache,
# then again on that cache, each logging the kernel specializations it compiled or loaded; RESULT
# lines give each run's wall time, exit, the rows passed / failing / missing and the specializations
# (scripts/triton_kernels.py count), and a last RESULT line the two runs against the targets
# (cold <= 180 s, warm <= 90 s). scripts/device_61.sh runs the sections.
#
#   PYTHONPATH=$PWD bash scripts/device_gate_cold.sh              # on the GPU, from the repository root
#   DEVICE=cpu PYTHONPATH=$PWD bash scripts/device_gate_cold.sh   # the CPU smoke path (a few specs, tiny)
#
# The check runs as one `lockstep check --device cuda -j 16` (JOBS=16: every golden once, rows handed
# out one at a time; scripts/check_cuda.sh); JOBS= (empty) runs the 16 shards of the four explicit
# pairs instead (796 rows: the last session's figures). The CPU smoke path always runs the shards.
# Limits in seconds: COLD_S=330 WARM_S=170 (the rest of the call is start-up and counting); WORK=DIR
# keeps the caches and logs; with $OUT set the logs and kernel logs come back in $OUT/device_61.tgz.
# SECTIONS=warmed (a second call on the same machine, the same WORK) compiles every specialization
# of cold's kernel log into a fresh cache, in parallel (scripts/triton_kernels.py warm: what a CI
# runner that keeps the kernel log does), then runs the check on it; the warm-up and that check
# together against the cold target (WARMUP_S=40 WARMED_S=90 by default: raise them to see it end).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=${PYTHONPATH:-$PWD}
[ "${DEVICE:-cuda}" = cpu ] || export JOBS=${JOBS-16}
work=${WORK:-$(mktemp -d)}
export WORK=$work
mkdir -p "$work"
out=$work/device_gate_cold.txt
COLD_S=${COLD_S:-330} WARM_S=${WARM_S:-170} bash scripts/device_61.sh ${SECTIONS:-cold warm} 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
verdict() {           # NAME TARGET [EXTRA]: "NAME=met(...)", "NAME=missed(...)" or "NAME=not-run" (EXTRA's wall added)
  local line wall exit extra
  line=$(grep -E "^RESULT $1 " "$out" | tail -1)
  [ -n "$line" ] || { echo "$1=not-run"; return; }
  wall=$(echo "$line" | sed -E 's/.*wall_s=([0-9.]+).*/\1/')
  exit=$(echo "$line" | sed -E 's/.* exit=([0-9]+).*/\1/')
  if [ -n "${3:-}" ]; then              # the warm-up before a warmed check counts toward its cold target
    extra=$(grep -E "^RESULT $3 " "$out" | tail -1 | sed -E 's/.*wall_s=([0-9.]+).*/\1/')
    wall=$(awk -v a="$wall" -v b="${extra:-0}" 'BEGIN {printf "%.1f", a + b}')
  fi
  if [ "$exit" = 0 ] && awk -v w="$wall" -v t="$2" 'BEGIN {exit !(w <= t)}'; then
    echo "$1=met(${wall}s<=${2}s)"
  else
    echo "$1=missed(${wall}s,exit=$exit,target=${2}s)"
  fi
}
echo "RESULT gate-targets $(verdict cold 180) $(verdict warm 90) $(verdict warmed 180 warm-up)"
exit "$rc"
