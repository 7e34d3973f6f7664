#!/usr/bin/env bash
# Device call N1 (carry .whl; no JIT cache survived the last session): the speculative GPU
# tests (c6ac63c's greedy chain fed on the device is not yet run on a GPU), then where a
# speculative 9B step spends its time on the current tree (tools/device/profile_spec.py:
# kernels, GPU idle gaps, each phase's GPU time), batch 1 and 8; then the caches.
set -uo pipefail
B=${B:-580}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 45 < want ? s - 45 : want )); }
timeout $(box 200) python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
  tests/engine/test_speculative_cuda.py >$OUT/spec_tests.log 2>&1
lap "spec tests rc=$?: $(grep -E 'passed|failed|error' $OUT/spec_tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/spec_tests.log | cut -c1-300 | head -12
for bs in 1 8; do
  want=$([ $bs = 1 ] && echo 250 || echo 150)
  timeout $(box $want) python3 tools/device/profile_spec.py --preset 9B --batch $bs \
    >$OUT/profile_b$bs.log 2>&1
  lap "profile b$bs rc=$?"; grep -v -E "INFO|USDT|_warn_once|UserWarning" $OUT/profile_b$bs.log \
    | cut -c1-130 | head -75
done
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
