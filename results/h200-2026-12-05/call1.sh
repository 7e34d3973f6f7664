#!/usr/bin/env bash
# Device call 1 of 2026-12-05 (issue 35 item 3, main at 7fc59ca + test fixes): the GPU state-tap
# tests, the engine's GPU tests, `bench reuse` traces on the 9B preset, a cold 8k prefill.
set -uo pipefail
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
t() { timeout "$1" python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE "${@:2}"; }
t 200 tests/ops/test_cuda_state_taps.py >$OUT/taps.log 2>&1; r=$?
lap "test_cuda_state_taps rc=$r: $(tail -1 $OUT/taps.log)"; grep -E "^(FAILED|ERROR)|Error" $OUT/taps.log | head
t 170 tests/engine/test_engine_cuda.py >$OUT/engine_cuda.log 2>&1; r=$?
lap "test_engine_cuda rc=$r: $(tail -1 $OUT/engine_cuda.log)"; grep -E "^(FAILED|ERROR)" $OUT/engine_cuda.log | head
timeout 110 python3 results/h200-2026-12-03/reuse_traces.py 9B cuda 1 agent,subagents,chat,edit,retry,noreply >$OUT/reuse_9b.log 2>&1; r=$?
lap "reuse rc=$r"; grep -v "INFO\|^{" $OUT/reuse_9b.log | tail -8
left=$((560 - ($(date +%s) - t0)))
[ "$left" -gt 40 ] && timeout $left python3 -m ninfer bench prefill --device cuda --preset 9B \
  --prompt-tokens 8192 --json $OUT/prefill_9b.json >$OUT/prefill_9b.log 2>&1
lap "prefill rc=$?"; grep -v "INFO" $OUT/prefill_9b.log | tail -6
save_caches >/dev/null 2>&1; ls -la $OUT | tail -5
