#!/usr/bin/env bash
# Device call 5 (issue 36): behaviour unchanged after EngineConfig in parts (hF: the warm-up takes
# OpsConfig / MemoryGeometry) and the Engine split (Roster, Admission, Stepper, Containment,
# Inbox): the 9B engine benchmark against the current table, then every engine GPU test file.
# One log: $OUT/call5.log.
set -uo pipefail
source tools/device/env.sh
L=$OUT/call5.log
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*" | tee -a $L; }
warm() { timeout 200 python3 tools/device/bench_ops.py --warm "$1" >/tmp/warm-$1.log 2>&1; echo "warm $1 rc=$?"; }
for w in prefill-bf16 decode-bf16; do warm "$w" & done  # FlashInfer's JIT (nvcc), in parallel
warm gdn-9B
wait
lap warm
timeout 200 python3 -m ninfer bench prefill,decode --device cuda --preset 9B \
  --prompt-tokens 1024,8192 --batch-sizes 1,4,8 --json $OUT/bench_9b.json >/tmp/bench.log 2>&1
lap "bench rc=$?"; cat /tmp/bench.log >>$L; grep -E "^│ (1024|8192|1|4|8) |steady" /tmp/bench.log | head -14
for t in test_engine_cuda test_faults_cuda test_engine_host_cuda test_graphs_decode \
    test_graphs_prefill test_overlap test_runner_feed test_engine_cuda_shapes \
    test_engine_pressure_cuda test_engine_cuda_warmup; do
  timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE tests/engine/$t.py \
    >/tmp/t.log 2>&1
  rc=$?; { echo "=== $t rc=$rc"; tail -30 /tmp/t.log; } >>$L
  lap "$t rc=$rc: $(grep -E 'passed|failed|error' /tmp/t.log | tail -1)"
done
save_caches >/dev/null
lap done
