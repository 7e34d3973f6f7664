#!/usr/bin/env bash
# Device call M2 (carry .whl .fi_cache): call M of 2026-12-06c in less time: issue 38's FP8
# decode after the split-K GEMV configs (5bf699f, not yet run on a GPU): every skinny config
# on the GPU, the GEMV race at 27B shapes (tools/device/bench_fp8.py, with the config each
# shape tuned to), then the 27B FP8 decode at batch 1 and 8 and its 8k prefill.
set -uo pipefail
B=${B:-580}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 10 < want ? s - 10 : want )); }
timeout $(box 110) python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
  tests/ops/test_cuda_fp8.py >$OUT/fp8_tests.log 2>&1
lap "fp8 tests rc=$?: $(grep -E 'passed|failed|error' $OUT/fp8_tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/fp8_tests.log | cut -c1-300 | head -12
timeout $(box 90) python3 tools/device/bench_fp8.py --json $OUT/bench_fp8.json >$OUT/bench_fp8.log 2>&1
lap "bench_fp8 rc=$?"; grep '"M"' $OUT/bench_fp8.log | grep -v prefill | cut -c1-220 | head -24
timeout $(box 260) python3 -m ninfer bench prefill,decode --device cuda --preset 27B \
  --quantization fp8 --prompt-tokens 8192 --batch-sizes 1,8 --json $OUT/fp8_27b.json \
  >$OUT/fp8_27b.log 2>&1
lap "27B fp8 rc=$?"; grep -v INFO $OUT/fp8_27b.log | grep -E "warm-up|│|rror" | cut -c1-200 | tail -16
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
