#!/usr/bin/env bash
# Device call Z1 (was Y3, plus the 9B 1k table) (carry .whl .fi_cache, call Y1's caches): the draft chain run ahead of the
# read (`Speculator._chain_ahead`, new): the speculative GPU tests (two new: the window pass
# against the one-token chain step, the drafts made ahead against those made after the read),
# the 9B steps at batch 1 and 8 with the chain ahead and after the read (same machine).
set -uo pipefail
B=${B:-480}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 20 < want ? s - 20 : want )); }
timeout $(box 150) python3 -m pytest -q -p no:cacheprovider tests/engine/test_speculative_cuda.py \
  -rA --durations=6 >$OUT/spec_tests.log 2>&1
lap "spec tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/spec_tests.log | tail -22
grep -E "^E  " $OUT/spec_tests.log | head -16
for bs in 1 8; do for mode in ahead after; do
  [ $(left) -lt 70 ] && break 2
  flag=""; [ $mode = after ] && flag="--no-ahead"
  timeout $(box 60) python3 tools/device/profile_spec.py --preset 9B --batch $bs \
    --draft-vocab 32768 --tokens 96 --no-profile $flag >$OUT/profile_b${bs}_$mode.log 2>&1
  lap "profile b$bs $mode rc=$?"
  grep -E "unprofiled|Engine.step|VerifyGraphs|Stepper.settle|_chain_ahead|Speculator.draft" \
    $OUT/profile_b${bs}_$mode.log
done; done
[ $(left) -gt 100 ] && { timeout $(box 200) python3 -m ninfer.bench.spec_table --device cuda --preset 9B --contexts 1024 --batch-sizes 1,4,8 --acceptance 0.7,0.9 --draft-vocab 32768 --json $OUT/spec_table_9B_1k.json >$OUT/spec_table_9B_1k.log 2>&1; lap "9B table rc=$?"; grep "│" $OUT/spec_table_9B_1k.log | tail -9; }
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsZ1.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
