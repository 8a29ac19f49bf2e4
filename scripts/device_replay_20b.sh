#!/usr/bin/env bash
# On one GPU: record and replay a 64-request trace of a synthetic gpt-oss-20b checkpoint (the
# real shape and HF layout, MXFP4 experts, random weights, made on the GPU: make-checkpoint --device),
# as docs/replay.md gives the commands.
# Prints each step's wall time and the replay's verdict; the trace's digest goes to $OUT when set.
#
#   PYTHONPATH=$PWD bash scripts/device_replay_20b.sh            # from the repository root
#   WORK=/data/x MAX_NEW=64 REQUESTS=64 bash scripts/device_replay_20b.sh
#   PRESET=tiny DEVICE=cpu REQUESTS=2 MAX_NEW=4 bash scripts/device_replay_20b.sh   # the CPU smoke path
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
work=${WORK:-$(mktemp -d)}
n=${REQUESTS:-64}
new=${MAX_NEW:-64}
preset=${PRESET:-gpt-oss-20b}
device=${DEVICE:-cuda}
backend=${BACKEND:-$([ "$device" = cuda ] && echo triton || echo torch)}   # the compiled kernels on a GPU
mkdir -p "$work"
step() {   # NAME COMMAND...: the command's output, then its wall time and exit code
  local name=$1 start rc
  shift
  echo "== $(date -u +%H:%M:%S) $name: $*"
  start=$(date +%s.%N)
  "$@"
  rc=$?
  echo "RESULT $name wall_s=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') exit=$rc"
  return $rc
}
python3 -c "import json; [print(json.dumps({'prompt': list(range(10 + i, 74 + i)), 'seed': i, 'sampling': {'temperature': 0.8, 'max_new_tokens': $new}})) for i in range($n)]" > "$work/reqs.jsonl"
# each step bounded (seconds: CK_S, RECORD_S, REPLAY_S), so one device call ends with what it reached;
# a step whose output WORK already holds is skipped (the checkpoint folder and the trace appear whole
# or not at all), so on a machine that keeps WORK the steps can span several calls
if [ -d "$work/ck20b" ]; then echo "== checkpoint: $work/ck20b is there"; else
step make-checkpoint timeout "${CK_S:-420}" python3 -m lockstep make-checkpoint --preset "$preset" --format mxfp4 \
  --max-gb 40 --device "$device" "$work/ck20b" || exit 1
fi
if [ -f "$work/t20b.jsonl" ]; then echo "== trace: $work/t20b.jsonl is there"; else
step record timeout "${RECORD_S:-200}" python3 -m lockstep record "$work/t20b.jsonl" --checkpoint "$work/ck20b" \
  --requests "$work/reqs.jsonl" --max-batch "$n" --device "$device" --dtype bf16 --backend "$backend" || exit 1
fi
step replay timeout "${REPLAY_S:-240}" python3 -m lockstep replay "$work/t20b.jsonl" --device "$device"
step replay-teacher-forced timeout "${REPLAY_S:-240}" python3 -m lockstep replay "$work/t20b.jsonl" --device "$device" \
  --mode teacher-forced
step replay-prefill-shaped timeout "${REPLAY_S:-240}" python3 -m lockstep replay "$work/t20b.jsonl" --device "$device" \
  --mode teacher-forced --forced-shape prefill
ls -la "$work/t20b.jsonl"
[ -n "${OUT:-}" ] && sha256sum "$work/t20b.jsonl" > "$OUT/t20b.sha256"
exit 0
