#!/usr/bin/env bash
# Device call E3: the 27B MTP decode bench alone on the GPU, then the op tests E1 left
# (test_cuda_ops beside test_cuda_glue + test_cuda_skinny).
set -uo pipefail
B=${B:-470}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
run_file() { local name=$1; shift; local s; s=$(left); [ "$s" -lt 15 ] && { lap "$name: no time left"; return; }
  timeout "$s" python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE --durations=3 "$@" >$OUT/$name.log 2>&1
  local rc=$?; lap "$name rc=$rc: $(grep -E 'passed|failed|error|skipped' $OUT/$name.log | tail -1)"
  grep -E "^(FAILED|ERROR)|^E  " $OUT/$name.log | cut -c1-300 | head -20; }
s=$(left); timeout $((s > 230 ? 230 : s)) python3 -m ninfer bench decode --preset 27B --speculative mtp \
  --draft-acceptance 0.7 --prompt-tokens 1024 --batch-sizes 1,8 --device cuda \
  --json $OUT/decode_27b_mtp.json >$OUT/decode_27b_mtp.log 2>&1
lap "decode_27b_mtp rc=$?"; grep -v INFO $OUT/decode_27b_mtp.log | cut -c1-220 | tail -16
run_file cuda_ops tests/ops/test_cuda_ops.py >$OUT/lane_a.txt 2>&1 &
( run_file glue tests/ops/test_cuda_glue.py; run_file skinny tests/ops/test_cuda_skinny.py ) >$OUT/lane_b.txt 2>&1 &
wait; cat $OUT/lane_a.txt $OUT/lane_b.txt; lap done
