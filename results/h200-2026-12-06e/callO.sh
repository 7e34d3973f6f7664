#!/usr/bin/env bash
# Device call O (carry .whl; cold caches): the speculative GPU tests on the tree whose greedy
# drafts stay on the device until the next verify reads them with its targets (no read after
# the chain), then the 9B speculative step profiled at batch 1 with that and with the drafts
# read back before each verify (--read-drafts), then the 9B MTP bench with --draft-vocab 32768.
set -uo pipefail
B=${B:-580}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 45 < want ? s - 45 : want )); }
timeout $(box 220) python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
  tests/engine/test_speculative_cuda.py >$OUT/spec_tests.log 2>&1
lap "spec tests rc=$?: $(grep -E 'passed|failed|error' $OUT/spec_tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/spec_tests.log | cut -c1-300 | head -12
for mode in lazy read; do
  flag=$([ $mode = lazy ] || echo "--read-drafts")
  timeout $(box 150) python3 tools/device/profile_spec.py --preset 9B --batch 1 $flag \
    >$OUT/profile_$mode.log 2>&1
  lap "profile $mode rc=$?"; grep -v -E "INFO|USDT|_warn_once|UserWarning" $OUT/profile_$mode.log \
    | grep -v -E "^(void|nvjet|triton_|_|Memcpy|chunk|recompute|fused)" | cut -c1-130 | head -30
done
timeout $(box 150) python3 -m ninfer bench decode --device cuda --preset 9B --prompt-tokens 1024 \
  --speculative mtp --draft-acceptance 0.7 --batch-sizes 1,8 --draft-vocab 32768 \
  --json $OUT/mtp_9b_32768.json >$OUT/mtp_9b_32768.log 2>&1
lap "9B mtp vocab 32768 rc=$?"; grep -v INFO $OUT/mtp_9b_32768.log | grep -E "│|rror" | cut -c1-200 | tail -6
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
