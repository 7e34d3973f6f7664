#!/usr/bin/env bash
# Device call N1 (carry .whl; no JIT cache survived the last session): the speculative GPU
# tests (c6ac63c's greedy chain fed on the device is not yet run on a GPU), then where a
# speculative 9B step spends its time on the current tree (tools/device/profile_spec.py:
# kernels, GPU idle gaps, each phase's GPU time), batch 1, after the 9B MTP decode bench
# with the whole draft vocabulary and with --draft-vocab 32768; then the caches.
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
for vocab in full 32768; do
  flag=$([ $vocab = full ] || echo "--draft-vocab $vocab")
  timeout $(box 120) python3 -m ninfer bench decode --device cuda --preset 9B --prompt-tokens 1024 \
    --speculative mtp --draft-acceptance 0.7 --batch-sizes 1,8 $flag --json $OUT/mtp_9b_$vocab.json \
    >$OUT/mtp_9b_$vocab.log 2>&1
  lap "9B mtp vocab $vocab rc=$?"; grep -v INFO $OUT/mtp_9b_$vocab.log | grep -E "│|rror" | cut -c1-200 | tail -6
done
for bs in 1; do
  want=250
  timeout $(box $want) python3 tools/device/profile_spec.py --preset 9B --batch $bs \
    >$OUT/profile_b$bs.log 2>&1
  lap "profile b$bs rc=$?"; grep -v -E "INFO|USDT|_warn_once|UserWarning" $OUT/profile_b$bs.log \
    | cut -c1-130 | head -75
done
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
