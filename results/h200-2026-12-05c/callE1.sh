#!/usr/bin/env bash
# Device call E1 (2026-12-05, third session): the GPU test sweep on the final tree, in three
# lanes at once on the one GPU (engine tests, the FP8 / MTP / vision / taps tests, the op
# tests); each file in its own time box inside the call's B seconds. No figures here.
set -uo pipefail
B=${B:-560}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
run_file() {  # name, file(s)...: pytest in what is left of the box
  local name=$1; shift; local s; s=$(left); [ "$s" -lt 15 ] && { lap "$name: no time left"; return; }
  timeout "$s" python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE --durations=3 "$@" \
    >$OUT/$name.log 2>&1
  local rc=$?; lap "$name rc=$rc: $(grep -E 'passed|failed|error|skipped' $OUT/$name.log | tail -1)"
  grep -E "^(FAILED|ERROR)|^E  " $OUT/$name.log | cut -c1-220 | head -12
}
python3 -c "import flashinfer, ninfer.ops.cuda, xgrammar" 2>&1 | tail -2
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
lane_engine() {
  for f in engine_cuda faults_cuda engine_host_cuda engine_cuda_shapes engine_cuda_warmup; do
    run_file $f tests/engine/test_$f.py; done
  run_file graphs tests/engine/test_graphs_decode.py tests/engine/test_graphs_prefill.py \
    tests/engine/test_overlap.py tests/engine/test_runner_feed.py
  run_file engine_pressure_cuda tests/engine/test_engine_pressure_cuda.py
}
lane_new() {
  run_file fp8 tests/ops/test_cuda_fp8.py
  run_file spec tests/engine/test_speculative_cuda.py
  run_file vision tests/vision/test_engine_images_cuda.py
  run_file taps tests/ops/test_cuda_state_taps.py
  run_file struct tests/engine/test_structured_cuda.py tests/engine/test_thinking_budget_cuda.py
}
lane_ops() {
  run_file moe tests/ops/test_cuda_moe.py
  run_file cuda_ops tests/ops/test_cuda_ops.py
  run_file glue tests/ops/test_cuda_glue.py
  run_file skinny tests/ops/test_cuda_skinny.py
}
lane_engine >$OUT/lane_engine.txt 2>&1 &
lane_new >$OUT/lane_new.txt 2>&1 &
lane_ops >$OUT/lane_ops.txt 2>&1 &
wait
for l in engine new ops; do echo "== lane $l"; cat $OUT/lane_$l.txt; done
lap done
