#!/usr/bin/env bash
# Device call V2 (carry .whl .fi_cache, call T's caches; call V never got a machine, and this
# is its core in the device time left): the speculative GPU tests with the verify graphs on
# fa3 (auto) and fa2, over long contexts too; fa2's verify attention at 9B and 27B heads,
# batch 1 and 8, 1k and 32k (call T faulted at 9B batch 8 32k in one of three ways); the 9B
# steps on fa2 timed by the drafts they accept.
set -uo pipefail
B=${B:-250}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 15 < want ? s - 15 : want )); }
timeout $(box 130) python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
  tests/engine/test_speculative_cuda.py -k "long_contexts or taps" >$OUT/spec_tests.log 2>&1
lap "spec tests rc=$?: $(grep -E 'passed|failed|error' $OUT/spec_tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  |PASSED|::" $OUT/spec_tests.log | cut -c1-200 | head -14
timeout $(box 35) python3 tools/device/bench_verify_attention.py --models 9B,27B --batches 1,8 \
  --contexts 1024,32768 --variants fa2 >$OUT/va_fa2.log 2>&1
lap "verify attention fa2 rc=$?"; grep -E "^ +(9B|27B)|rror" $OUT/va_fa2.log | head -10
timeout $(box 70) python3 tools/device/profile_spec.py --preset 9B --batch 1 --draft-vocab 32768 \
  --tokens 96 --no-profile --verify-backend fa2 >$OUT/profile.log 2>&1
lap "profile rc=$?"; grep -v -E "INFO|Warn|warn" $OUT/profile.log | tail -20
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsV2.tgz -C /tmp logs; ls $OUT | tr '\n' ' '; lap done
