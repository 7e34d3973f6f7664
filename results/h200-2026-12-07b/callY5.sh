#!/usr/bin/env bash
# Device call Y5 (carry .whl .fi_cache, call Y1's caches; the budget's last 261 s): callY3.sh
# cut to the speculative GPU tests, then, if time is left, the 9B batch-1 steps with the chain
# ahead and after the read.
set -uo pipefail
B=${B:-150}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
timeout $(( $(left) - 10 )) python3 -m pytest -q -p no:cacheprovider \
  tests/engine/test_speculative_cuda.py -rA --durations=4 >$OUT/spec_tests.log 2>&1
lap "spec tests rc=$?"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $OUT/spec_tests.log | tail -22
grep -E "^E  " $OUT/spec_tests.log | head -16
for mode in ahead after; do
  [ $(left) -lt 45 ] && break
  flag=""; [ $mode = after ] && flag="--no-ahead"
  timeout $(( $(left) - 5 )) python3 tools/device/profile_spec.py --preset 9B --batch 1 \
    --draft-vocab 32768 --tokens 96 --no-profile $flag >$OUT/profile_b1_$mode.log 2>&1
  lap "profile b1 $mode rc=$?"
  grep -E "unprofiled|Engine.step|VerifyGraphs|Stepper.settle" $OUT/profile_b1_$mode.log
done
lap done
