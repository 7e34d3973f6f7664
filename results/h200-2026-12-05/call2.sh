#!/usr/bin/env bash
# Device call 2 of 2026-12-05 (issue 35 item 3): the GPU state-tap op tests in the model dtype
# (bf16; Triton cache of call 1 carried), the two corrected in-pass engine tests and the
# prompt-end ones, then `bench reuse` subagents (scale 1) and noreply (scale 4) on the 9B preset.
set -uo pipefail
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
t() { timeout "$1" python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE --durations=8 "${@:2}"; }
t 200 tests/ops/test_cuda_state_taps.py -k "bf16 or off_the_chunk" >$OUT/taps.log 2>&1; r=$?
lap "test_cuda_state_taps rc=$r"; grep -E "passed|failed|^(FAILED|ERROR)|s call" $OUT/taps.log | head -14
t 100 tests/engine/test_engine_cuda.py -k "in_pass or fork_inside or prompt_end" >$OUT/engine_cuda.log 2>&1; r=$?
lap "test_engine_cuda rc=$r: $(tail -1 $OUT/engine_cuda.log)"; grep -E "^(FAILED|ERROR)" $OUT/engine_cuda.log | head
timeout 100 python3 results/h200-2026-12-05/reuse_detail.py 9B cuda 1 subagents >$OUT/reuse_sub_9b.log 2>&1
lap "reuse subagents rc=$?"; grep -v "INFO" $OUT/reuse_sub_9b.log | tail -3
left=$((570 - ($(date +%s) - t0)))
[ "$left" -gt 60 ] && timeout $left python3 results/h200-2026-12-05/reuse_detail.py 9B cuda 4 noreply >$OUT/reuse_noreply_9b.log 2>&1
lap "reuse noreply rc=$?"; grep -v "INFO" $OUT/reuse_noreply_9b.log | awk '$6!=$8' | tail -30
