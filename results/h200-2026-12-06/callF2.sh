#!/usr/bin/env bash
# Device call F2 (the machine F1 left warm): issue 40's vision bench on the 9B preset with the
# released tower (a 1024x1024 image), then issue 36's last GPU file, tests/ops/test_cuda_ops.py,
# alone on the GPU, then the MTP parity test if time is left.
set -uo pipefail
B=${B:-420}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
run_file() { local name=$1; shift; local s; s=$(left); [ "$s" -lt 15 ] && { lap "$name: no time left"; return; }
  timeout "$s" python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE --durations=5 "$@" >$OUT/$name.log 2>&1
  local rc=$?; lap "$name rc=$rc: $(grep -E 'passed|failed|error|skipped' $OUT/$name.log | tail -1)"
  grep -E "^(FAILED|ERROR)|^E  " $OUT/$name.log | cut -c1-300 | head -20; }
timeout 150 python3 -m ninfer.bench.vision --preset 9B --device cuda --side 1024 --repeats 5 \
  >$OUT/vision_9b.json 2>$OUT/vision_9b.err
lap "vision rc=$?"; cat $OUT/vision_9b.json; grep -v INFO $OUT/vision_9b.err | tail -5
run_file cuda_ops tests/ops/test_cuda_ops.py
grep -A8 "slowest" $OUT/cuda_ops.log | cut -c1-160
run_file spec tests/engine/test_speculative_cuda.py
lap done
