#!/usr/bin/env bash
# On one GPU: record / replay / import-peer with --device cuda on a small checkpoint, replay spread
# over two data-parallel ranks sharing the GPU, and the synthetic gpt-oss-20b checkpoint's build rate.
# Prints RESULT lines (name, wall seconds, exit code); a step's failure does not stop the others.
#
#   PYTHONPATH=$PWD bash scripts/device_57.sh                 # from the repository root, on a GPU
#   DEVICE=cpu CK20B_SECONDS=5 bash scripts/device_57.sh      # the CPU smoke path
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
device=${DEVICE:-cuda}
work=${WORK:-$(mktemp -d)}
step() {   # NAME COMMAND...: the command's output (last 25 lines), its wall time and exit code
  local name=$1 start rc
  shift
  echo "== $(date -u +%H:%M:%S) $name: $*"
  start=$(date +%s.%N)
  "$@" > "$work/$name.out" 2>&1
  rc=$?
  tail -n 25 "$work/$name.out"
  echo "RESULT $name wall_s=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') exit=$rc"
}
ck=models/tiny-target
python3 -c "import json; [print(json.dumps({'prompt': list(range(10 + i, 26 + i)), 'seed': i, 'sampling': {'temperature': 0.8, 'max_new_tokens': 16}})) for i in range(8)]" > "$work/reqs.jsonl"
step record python3 -m lockstep record "$work/t.jsonl" --checkpoint "$ck" --requests "$work/reqs.jsonl" --max-batch 8 --device "$device" --dtype bf16 --json
step replay python3 -m lockstep replay "$work/t.jsonl"
step replay-teacher-forced python3 -m lockstep replay "$work/t.jsonl" --mode teacher-forced
step replay-dp2 python3 -m lockstep replay "$work/t.jsonl" --dp 2 --json
step replay-dp2-teacher-forced python3 -m lockstep replay "$work/t.jsonl" --dp 2 --mode teacher-forced
# the recorded tokens and logprobs as another engine's rollouts: teacher-forced on the GPU they must agree
python3 - "$work/t.jsonl" > "$work/rollouts.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = {}
for r in recs:
    if r.get("kind") == "step":
        steps.setdefault(r["request"], []).append(r)
for r in recs:
    if r.get("kind") == "request":
        mine = sorted(steps.get(r["index"], []), key=lambda s: s["step"])
        print(json.dumps({"prompt_ids": r["prompt"], "response_ids": [s["token"] for s in mine],
                          "logprobs": [s["logprob"] for s in mine]}))
PY
step import-peer python3 -m lockstep import-peer "$work/rollouts.jsonl" --format rollouts --checkpoint "$ck" --device "$device" --dtype bf16
step import-peer-dp2 python3 -m lockstep import-peer "$work/rollouts.jsonl" --format rollouts --checkpoint "$ck" --device "$device" --dtype bf16 --dp 2
# how fast the synthetic 20b checkpoint is made here (its tensors' progress lines), cut at CK20B_SECONDS
step make-checkpoint-20b timeout "${CK20B_SECONDS:-150}" python3 -m lockstep make-checkpoint --preset gpt-oss-20b --format mxfp4 --max-gb 40 "$work/ck20b"
exit 0
