#!/usr/bin/env bash
# Device call I (carry .whl .fi_cache; sixth session): the speculator's CUDA graphs (verify,
# bridge, chain) on a GPU: MTP parity against plain decode with graphs, eager and replay
# roll-backs, then issue 37's decode figures with a controlled acceptance a = 0.7 (K = 3):
# 9B batch 1 and 8, 27B batch 1, and the 9B without speculation on the same machine.
set -uo pipefail
B=${B:-580}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 10 < want ? s - 10 : want )); }
timeout $(box 200) python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
  tests/engine/test_speculative_cuda.py >$OUT/spec_tests.log 2>&1
lap "spec tests rc=$?: $(grep -E 'passed|failed|error' $OUT/spec_tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/spec_tests.log | cut -c1-300 | head -12
bench() { local name=$1 want=$2; shift 2
  timeout $(box $want) python3 -m ninfer bench decode --device cuda --prompt-tokens 1024 "$@" \
    --json $OUT/$name.json >$OUT/$name.log 2>&1
  lap "$name rc=$?"; grep -v INFO $OUT/$name.log | grep -E "warm-up|ready|│|Error|error" | cut -c1-200 | tail -14; }
bench mtp_9b 150 --preset 9B --speculative mtp --draft-acceptance 0.7 --batch-sizes 1,8
bench mtp_27b 170 --preset 27B --speculative mtp --draft-acceptance 0.7 --batch-sizes 1
bench plain_9b 90 --preset 9B --batch-sizes 1,8
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs; ls $OUT | tr '\n' ' '; lap done
