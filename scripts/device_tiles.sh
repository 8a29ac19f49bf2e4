#!/usr/bin/env bash
# Issue 35 item 2 on one H200: the grouped expert kernels' rows per block follow the launch
# (kernels.moe.expert_block_m) without moving a bit. Run from the repository root; <= 240 s.
#
#   1. BITS  tests/kernels/test_grouped_block_m.py compiled: gate_up and down at every block size
#            the policy can pick give the bits of 16 at the 20b shapes: bf16 dense at 32, 64, 128,
#            MXFP4 packed (fast decode on and off) at 32; the engine takes the policy's size; D2
#            through the engine.
#   2. GOLDENS  the CUDA goldens of the grouped experts, MXFP4 and generate (plus the two prefix-cache
#            specs whose one-shot prefills take 32-row blocks at bf16) on the triton backend, both
#            dtypes: every one must pass unchanged (generate/long-prompt-window's 260-token prefill
#            takes 128-row blocks at bf16, its 64-token chunks 32, and must equal them bitwise).
#   3. FIGURES  bench/moe.py's grouped table (16 rows a block against the engine's choice, in one
#            process, with its own bit columns: exit 3 on a difference; then every size at 256 and
#            2048 tokens, to check the thresholds), then bench/e2e.py's decode and prefill 2048 for
#            bf16 and MXFP4 experts; last, if time is left, bench/linear_tiles.py at M = 2048 (qkv and
#            an o_proj chunk): would 128-row tiles help the dense projections, with the same bits?
#            (information only: the dense linear's tiles are not changed).
#
# Exit 1 when a bit check fails (step 1, 2 or bench/moe.py's bit columns), 2 when none failed but
# step 1 or 2 ran out of time; figures that run out of time print "TIMED OUT" and change nothing. If only the MXFP4 cases of step 1 fail ("mxfp4
# ... at block_m 32 != block_m 16"), set kernels/moe.py MXFP4_MAX_BLOCK_M = 16 (MXFP4 keeps 16 rows
# a block); if a dense case fails, set EXPERT_BLOCK_FOLLOWS_ROWS = False. bench/moe.py's per-size
# table marks with "!" every size whose bits differ from 16's; MXFP4 past MXFP4_MAX_BLOCK_M = 32 is
# "n/a" (measured: its fast decode at 64+ rows aborts the compiler, its exact decode gives other bits).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD LOCKSTEP_JOBS=1
start=$SECONDS
status=0          # 1: a bit check failed
incomplete=0      # a bit check ran out of time (exit 2 when nothing failed)
step() { echo; echo "=== [$((SECONDS - start)) s] $*"; }

step "device"
echo "HEAD $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
python3 -c 'import torch, triton; print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)'

# Steps 1 and 2 run side by side (their time is mostly Triton compiles, on separate cores); the
# figures after them run alone.
xdist=$(python3 -c 'import xdist' 2>/dev/null && echo "-n 4" || echo "")
step "1+2. BITS (tests/kernels/test_grouped_block_m.py compiled ${xdist}) and GOLDENS (harness check) side by side"
# Each in its own session (setsid: its pid is the process group), so that a timeout also ends its
# worker processes (pytest-xdist, check -j) instead of leaving them on the GPU during the figures.
setsid timeout 130 python3 -m pytest -q -rA -o addopts="" -p no:cacheprovider $xdist \
  tests/kernels/test_grouped_block_m.py > /tmp/device_tiles_bits.log 2>&1 &
bits_pid=$!
setsid timeout 130 python3 -m lockstep check --device cuda -j 8 --backend triton 'kernels/experts*' 'mxfp4/*' \
  'generate/*' 'prefix-cache/seeded-unchunked' 'prefix-cache/tile-block-chunk-splits' > /tmp/device_tiles_check.log 2>&1 &
check_pid=$!
wait $bits_pid; bits_rc=$?
wait $check_pid; check_rc=$?
kill -KILL -- -"$bits_pid" -"$check_pid" 2>/dev/null   # what is left of either group (nothing, normally)

step "1. BITS: every block size gives 16's bits (compiled)"
grep -E '^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed|block_m [0-9]+ !=|Error' /tmp/device_tiles_bits.log | tail -40
if [ "$bits_rc" -eq 124 ]; then echo "BITS: TIMED OUT (tests above are those reached)"; incomplete=1
elif [ "$bits_rc" -ne 0 ]; then echo "BITS: FAILED (pytest exit $bits_rc)"; status=1; else echo "BITS: PASS"; fi

step "2. GOLDENS: harness check --device cuda --backend triton (both dtypes)"
grep -i -E '^(pass|mismatch|failed|crash|corrupt|missing|incomparable) ' /tmp/device_tiles_check.log \
  | awk '{print $1}' | sort | uniq -c
grep -i -E '^(mismatch|failed|crash|corrupt|missing|incomparable) |^lockstep: ' /tmp/device_tiles_check.log | head -20
tail -2 /tmp/device_tiles_check.log
if [ "$check_rc" -eq 124 ]; then echo "GOLDENS: TIMED OUT (rows above are those reached)"; incomplete=1
elif [ "$check_rc" -ne 0 ]; then echo "GOLDENS: FAILED (exit $check_rc)"; status=1; else echo "GOLDENS: PASS"; fi

step "3a. FIGURES: python3 bench/moe.py --only grouped --grouped-T 1 32 2048 --block-m-T 256 2048"
timeout 60 python3 bench/moe.py --only grouped --grouped-T 1 32 2048 --block-m-T 256 2048
rc=$?
if [ "$rc" -eq 3 ]; then echo "bench/moe.py: BITS DIFFER between block sizes"; status=1
elif [ "$rc" -eq 124 ]; then echo "bench/moe.py: TIMED OUT"; elif [ "$rc" -ne 0 ]; then echo "bench/moe.py: exit $rc"; fi

left=$((236 - (SECONDS - start)))          # e2e prints its table at the end: it gets what is left
step "3b. FIGURES: bench/e2e.py (${left} s for it)"
if [ "$left" -gt 20 ]; then
  timeout "$left" python3 bench/e2e.py --dtype bf16,mxfp4 --modes deterministic --batches 1,32 --prefill 2048 \
    --new-tokens 0 --repeat 5 --no-hf
  rc=$?
  [ "$rc" -eq 124 ] && echo "bench/e2e.py: TIMED OUT"
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && echo "bench/e2e.py: exit $rc"
else
  echo "bench/e2e.py: not run (no time left)"
fi

left=$((236 - (SECONDS - start)))
step "3c. FIGURES (linear tiles at prefill, bits across BLOCK_M 64/128; the first row is the tiles in use): ${left} s"
if [ "$left" -gt 15 ]; then
  timeout "$left" python3 bench/linear_tiles.py --M 2048 --shapes qkv "o_proj chunk" --block-m 64 128 \
    --block-n 32 64 128 --block-k 64 --stages 3 --warps 4 8 --top 12 || echo "bench/linear_tiles.py: exit $? (124: timed out)"
else
  echo "bench/linear_tiles.py: not run (no time left)"
fi

if [ $status -ne 0 ]; then step "done: a bit check FAILED"; exit 1; fi
if [ $incomplete -ne 0 ]; then step "done: no bit check failed, but one TIMED OUT"; exit 2; fi
step "done: every bit check PASSED"
exit 0
