#!/usr/bin/env bash
# Device call P (carry .whl .fi_cache, call O's caches): the speculative GPU tests on the tree
# whose greedy verify steps run the bridge ahead of the read (4071fab), the 9B speculative step
# timed phase by phase without the profiler (tools/device/profile_spec.py), then 9B plain and
# MTP decode (--draft-vocab 32768) at batch 1 and 8, and 27B plain and MTP at batch 1.
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
timeout $(box 110) python3 tools/device/profile_spec.py --preset 9B --batch 1 --draft-vocab 32768 \
  >$OUT/profile.log 2>&1
lap "profile rc=$?"; grep -v -E "INFO|USDT|_warn_once|UserWarning" $OUT/profile.log \
  | grep -v -E "^(void|nvjet|triton_|_[a-z]|Memcpy|chunk|recompute|fused)" | cut -c1-130 | head -40
run() {  # name, then bench flags
  local name=$1; shift
  timeout $(box 110) python3 -m ninfer bench decode --device cuda --prompt-tokens 1024 "$@" \
    --json $OUT/$name.json >$OUT/$name.log 2>&1
  lap "$name rc=$?"; grep -v INFO $OUT/$name.log | grep -E "│|rror" | grep -v "end to end" \
    | cut -c1-120 | tail -6
}
run mtp_9b --preset 9B --speculative mtp --draft-acceptance 0.7 --batch-sizes 1,8 --draft-vocab 32768
run plain_9b --preset 9B --batch-sizes 1,8
run mtp_27b --preset 27B --speculative mtp --draft-acceptance 0.7 --batch-sizes 1 --draft-vocab 32768
run plain_27b --preset 27B --batch-sizes 1
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs; ls $OUT | tr '\n' ' '; lap done
