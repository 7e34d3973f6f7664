#!/usr/bin/env bash
# Device call 2 of 2026-12-05: issue 35 item 3 (the GPU state-tap op tests in the model dtype,
# bf16; the corrected in-pass engine tests and the prompt-end ones), issue 38 (the FP8 op
# tests), issue 37 (the MTP GPU tests), then the FP8 microbench while time is left.
# B: seconds the whole command may take (the session's device time left).
set -uo pipefail
B=${B:-400}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
t() { local s; s=$(left); [ "$s" -gt "$1" ] && s=$1; [ "$s" -lt 20 ] && return 99
  timeout "$s" python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE --durations=3 "${@:2}"; }
t 110 tests/ops/test_cuda_state_taps.py -k "bf16 or off_the_chunk" >$OUT/taps.log 2>&1; r=$?
lap "test_cuda_state_taps rc=$r"; grep -E "passed|failed|^(FAILED|ERROR)|s call" $OUT/taps.log | head -8
t 80 tests/engine/test_engine_cuda.py -k "in_pass or fork_inside or prompt_end" >$OUT/engine_cuda.log 2>&1; r=$?
lap "test_engine_cuda rc=$r: $(tail -1 $OUT/engine_cuda.log)"; grep -E "^(FAILED|ERROR)" $OUT/engine_cuda.log | head
t 100 tests/ops/test_cuda_fp8.py >$OUT/fp8.log 2>&1; r=$?
lap "test_cuda_fp8 rc=$r: $(tail -1 $OUT/fp8.log)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/fp8.log | head -20
t 80 tests/engine/test_speculative_cuda.py >$OUT/spec.log 2>&1; r=$?
lap "test_speculative_cuda rc=$r: $(tail -1 $OUT/spec.log)"; grep -E "^(FAILED|ERROR)|^E  " $OUT/spec.log | head -20
s=$(left); [ "$s" -gt 30 ] && timeout $((s - 5)) python3 tools/device/bench_fp8.py --json $OUT/bench_fp8.json >$OUT/bench_fp8.log 2>&1
lap "bench_fp8 rc=$?"; cut -c1-230 $OUT/bench_fp8.log | tail -24
