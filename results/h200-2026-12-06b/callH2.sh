#!/usr/bin/env bash
# Device call H2 (after H, on the machine it leaves warm): the GPU tests the final tree has not
# run: the state taps at any offset (3c59bad: near the row's start too), the engine's
# cached-equals-cold tests with exact taps inside long passes (e2f55ae) and taps in rows
# resumed off the page grid, and MTP parity with both roll-backs (per-position taps, replay).
set -uo pipefail
B=${B:-580}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
run_file() { local name=$1; shift; local s; s=$(left); [ "$s" -lt 20 ] && { lap "$name: no time left"; return; }
  timeout $((s - 10)) python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE --durations=5 "$@" >$OUT/$name.log 2>&1
  local rc=$?; lap "$name rc=$rc: $(grep -E 'passed|failed|error|skipped' $OUT/$name.log | tail -1)"
  grep -E "^(FAILED|ERROR)|^E  " $OUT/$name.log | cut -c1-300 | head -12; }
run_file state_taps tests/ops/test_cuda_state_taps.py
run_file engine_cuda tests/engine/test_engine_cuda.py
run_file spec tests/engine/test_speculative_cuda.py
# at most 8 files come back: the logs in one archive, then the caches' parts
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
