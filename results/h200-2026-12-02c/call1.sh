#!/usr/bin/env bash
# Device call 1 of the eighteenth session (tree 4698770, the thin PrefixIndex): the engine
# benchmark on the final renovated tree (issue 25; compare results/h200-2026-12-01j/bench_after.*)
# and the engine GPU test files (default: test_faults_cuda.py, after HostFaults' shared _write,
# and test_engine_cuda.py; call 2: NO_BENCH=1 GPU_TESTS="the other engine files").
set -uo pipefail
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
[ -n "${NO_BENCH:-}" ] || timeout 200 python3 -m ninfer bench prefill,decode --device cuda --preset 9B \
  --prompt-tokens 1024,8192 --batch-sizes 1,4,8 --json $OUT/bench_final.json >$OUT/bench_final.log 2>&1
lap "bench rc=$?"
GPU_TESTS="${GPU_TESTS:-tests/engine/test_faults_cuda.py tests/engine/test_engine_cuda.py}" \
  SKIP_WARM=1 NO_SAVE=1 TEST_TIMEOUT=140 bash tools/device/run_suite.sh 2>&1 | grep -E "rc=|done"
lap "gpu tests"
