#!/usr/bin/env bash
# Device call V (carry .whl .fi_cache, call T's caches): the verify step's attention one way
# per process (call T's run faulted at 9B batch 8, 32k, in one of them), the speculative GPU
# tests with the verify graphs on fa2 (now the default) and fa3 and over long contexts, issue
# 37's 9B table at 1k with fa2, the step times by accepted drafts (is a rejecting step
# dearer?), then 9B at 32k, batch 1.
set -uo pipefail
B=${B:-560}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 30 < want ? s - 30 : want )); }
for v in fa2 decode fa3; do
  timeout $(box 60) python3 tools/device/bench_verify_attention.py --models 9B,27B --batches 1,8 \
    --contexts 1024,32768 --variants $v --json $OUT/verify_attention_$v.json >$OUT/va_$v.log 2>&1
  lap "verify attention $v rc=$?"; grep -E "^ +(9B|27B)|rror" $OUT/va_$v.log | head -10
done
timeout $(box 170) python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
  tests/engine/test_speculative_cuda.py -k "long_contexts or taps" >$OUT/spec_tests.log 2>&1
lap "spec tests rc=$?: $(grep -E 'passed|failed|error' $OUT/spec_tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/spec_tests.log | cut -c1-300 | head -12
timeout $(box 130) python3 -m ninfer.bench.spec_table --device cuda --preset 9B --contexts 1024 \
  --batch-sizes 1,4,8 --acceptance 0.5,0.7,0.9 --draft-vocab 32768 \
  --json $OUT/spec_table_9B.json >$OUT/spec_table_9B.log 2>&1
lap "spec_table 9B 1k rc=$?"; grep -E "│" $OUT/spec_table_9B.log | tail -12
timeout $(box 80) python3 tools/device/profile_spec.py --preset 9B --batch 1 --draft-vocab 32768 \
  --tokens 96 --no-profile >$OUT/profile.log 2>&1
lap "profile rc=$?"; grep -v -E "INFO|Warn|warn" $OUT/profile.log | tail -22
timeout $(box 200) python3 -m ninfer.bench.spec_table --device cuda --preset 9B --contexts 32768 \
  --batch-sizes 1 --acceptance 0.7 --draft-vocab 32768 \
  --json $OUT/spec_table_9B_32k.json >$OUT/spec_table_9B_32k.log 2>&1
lap "spec_table 9B 32k rc=$?"; grep -E "│" $OUT/spec_table_9B_32k.log | tail -4
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsV.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
