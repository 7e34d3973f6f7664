#!/usr/bin/env bash
# Device call B (after A; carry .fi_cache if the machine went cold): issue 36's last GPU file,
# tests/ops/test_cuda_ops.py, alone on the GPU; then the MTP parity test if time is left.
set -uo pipefail
B=${B:-420}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
run_file() { local name=$1; shift; local s; s=$(left); [ "$s" -lt 15 ] && { lap "$name: no time left"; return; }
  timeout "$s" python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE --durations=5 "$@" >$OUT/$name.log 2>&1
  local rc=$?; lap "$name rc=$rc: $(grep -E 'passed|failed|error|skipped' $OUT/$name.log | tail -1)"
  grep -E "^(FAILED|ERROR)|^E  " $OUT/$name.log | cut -c1-300 | head -20; }
run_file cuda_ops tests/ops/test_cuda_ops.py
grep -A8 "slowest" $OUT/cuda_ops.log | cut -c1-160
run_file spec tests/engine/test_speculative_cuda.py
lap done
