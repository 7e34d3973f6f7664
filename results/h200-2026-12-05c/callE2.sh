#!/usr/bin/env bash
# Device call E2: the tests E1 left (speculative with its log, the warm-up alone, structured
# with pydantic carried, graphs, pressure), then the 27B FP8 decode bench.
set -uo pipefail
B=${B:-540}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
run_file() { local name=$1 cap=$2; shift 2; local s; s=$(left); [ "$s" -gt "$cap" ] && s=$cap
  [ "$s" -lt 15 ] && { lap "$name: no time left"; return; }
  timeout "$s" python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE --durations=3 "$@" >$OUT/$name.log 2>&1
  local rc=$?; lap "$name rc=$rc: $(grep -E 'passed|failed|error|skipped' $OUT/$name.log | tail -1)"
  grep -E "^(FAILED|ERROR)|^E  " $OUT/$name.log | cut -c1-300 | head -30; }
run_file spec 80 tests/engine/test_speculative_cuda.py
grep -B5 -A40 "index lanes or batches open" $OUT/spec.log | cut -c1-200 | head -80
run_file warmup 60 tests/engine/test_engine_cuda_warmup.py
run_file struct 90 tests/engine/test_structured_cuda.py tests/engine/test_thinking_budget_cuda.py
run_file graphs 90 tests/engine/test_graphs_decode.py tests/engine/test_graphs_prefill.py tests/engine/test_overlap.py tests/engine/test_runner_feed.py
run_file pressure 60 tests/engine/test_engine_pressure_cuda.py
s=$(left); [ "$s" -gt 60 ] && timeout "$s" python3 -m ninfer bench decode --preset 27B --quantization fp8 --prompt-tokens 1024 --batch-sizes 1,8 --device cuda --json $OUT/decode_27b_fp8.json >$OUT/decode_27b_fp8.log 2>&1
lap "decode_27b_fp8 rc=$?"; grep -v INFO $OUT/decode_27b_fp8.log | cut -c1-220 | tail -14
