#!/usr/bin/env bash
# Device call Y1 (carry .whl .fi_cache, call X2's caches): the speculative GPU tests under
# their current names (fa2 default; f9a3d39's K-token last rows never ran on a GPU), the 9B
# batch-1 verify step profiled kernel by kernel on fa2 (why it costs 1.3x a plain step), then
# the 9B 32k rows at batch 4 and 8 that call X2 left without a window.
set -uo pipefail
B=${B:-560}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 20 < want ? s - 20 : want )); }
timeout $(box 200) python3 -m pytest -q -p no:cacheprovider tests/engine/test_speculative_cuda.py \
  -rA --durations=8 >$OUT/spec_tests.log 2>&1
lap "spec tests rc=$?"; grep -E "PASS|FAIL|ERROR|passed|failed|rank|gap" $OUT/spec_tests.log | tail -24
timeout $(box 150) python3 tools/device/profile_spec.py --preset 9B --batch 1 --draft-vocab 32768 \
  --tokens 96 >$OUT/profile.log 2>&1
lap "profile rc=$?"; grep -v -E "INFO|Warn|warn" $OUT/profile.log | tail -75
timeout $(box 190) python3 -m ninfer.bench.spec_table --device cuda \
  --preset 9B --contexts 32768 --batch-sizes 4,8 --acceptance 0.7,0.9 \
  --draft-vocab 32768 --json $OUT/spec_table_9B_32k.json >$OUT/spec_table_9B_32k.log 2>&1
lap "9B 32k rc=$?"; grep "│" $OUT/spec_table_9B_32k.log | tail -8
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsY1.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
