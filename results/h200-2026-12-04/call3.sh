#!/usr/bin/env bash
# Device call 3 (issues 36, 39, 35): the engine GPU test files on the merged tree (house: one of
# each, dead code out, the inspection seam, Request / KVLane; structured outputs; output-
# boundary snapshots), the 9B engine benchmark against the current table, and decode at batch 8
# with four of eight lanes constrained by a JSON schema against all-free.
set -uo pipefail
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
warm() { timeout 200 python3 tools/device/bench_ops.py --warm "$1" >"$OUT/warm-$1.log" 2>&1; echo "warm $1 rc=$?"; }
for w in prefill-bf16 decode-bf16; do warm "$w" & done  # FlashInfer's JIT (nvcc), in parallel
warm gdn-9B
wait
lap warm
timeout 200 python3 -m ninfer bench prefill,decode --device cuda --preset 9B \
  --prompt-tokens 1024,8192 --batch-sizes 1,4,8 --json $OUT/bench_9b.json >$OUT/bench_9b.log 2>&1
lap "bench rc=$?"; grep -E "^│ (1024|8192|1|4|8) |steady|bound" $OUT/bench_9b.log | head -14
timeout 100 python3 tools/bench_structured.py --preset 9B --device cuda --batch 8 --constrained 4 \
  >$OUT/structured.json 2>$OUT/structured.err
lap "structured rc=$?"; tail -c 1500 $OUT/structured.json; tail -3 $OUT/structured.err
for t in test_engine_cuda test_faults_cuda test_engine_host_cuda test_graphs_decode \
    test_graphs_prefill test_overlap test_runner_feed test_engine_cuda_shapes \
    test_engine_pressure_cuda test_engine_cuda_warmup; do
  timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE tests/engine/$t.py \
    >$OUT/$t.log 2>&1
  lap "$t rc=$?: $(grep -E 'passed|failed|error' $OUT/$t.log | tail -1)"
done
save_caches >/dev/null
lap done
