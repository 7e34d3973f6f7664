#!/usr/bin/env bash
# Device call 1 of 2026-12-03 (issue 35: PROMPT_END snapshots): the cold 8k prefill of the 9B
# preset (the snapshot at the prompt end may not slow it: 199.5 ms before), then `bench reuse`
# at --prompt-tokens 8192 (scale 4: the noreply trace starts at 8192 tokens, +2000 a turn), then
# the engine GPU test files that drive the publisher on CUDA.
set -uo pipefail
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
timeout 170 python3 -m ninfer bench prefill --device cuda --preset 9B --prompt-tokens 1024,8192 \
  --json $OUT/prefill_9b.json >$OUT/prefill_9b.log 2>&1
lap "prefill rc=$?"; tail -12 $OUT/prefill_9b.log
timeout 300 python3 -m ninfer bench reuse --device cuda --preset 9B --prompt-tokens 8192 \
  --json $OUT/reuse_9b.json >$OUT/reuse_9b.log 2>&1
lap "reuse rc=$?"; tail -14 $OUT/reuse_9b.log
left=$((560 - ($(date +%s) - t0)))
if [ "$left" -gt 60 ]; then
  GPU_TESTS="tests/engine/test_engine_cuda.py tests/engine/test_engine_host_cuda.py" \
    SKIP_WARM=1 NO_SAVE=1 TEST_TIMEOUT=$((left / 2)) bash tools/device/run_suite.sh 2>&1 | grep -E "rc=|done"
fi
lap "done"
