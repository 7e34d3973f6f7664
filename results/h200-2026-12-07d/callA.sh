#!/usr/bin/env bash
# Device call A (carry .whl .fi_cache), issue 38: the FP8 decode GEMV with GROUPS > 1 configs
# (a step reads 2 or 4 of a row's 128-column tiles side by side: 256 or 512 contiguous bytes,
# where a 128 x 128-block weight held the others to 128). The FP8 GPU tests (every config), the
# GEMV race at the 27B shapes (each shape's tuned config beside the fastest GROUPS 1 config,
# `fp8-groups1`, in the same graphs), then the 27B FP8 decode at batch 1 and 8 and its 8k
# prefill with bf16 beside it (callM2.sh of results/h200-2026-12-06e with the new configs).
# The prefill rows time the activation quantisation as one Triton pass (`quantize_groups`),
# where call M2 ran five torch passes over an fp32 copy of x.
set -uo pipefail
B=${B:-580}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 10 < want ? s - 10 : want )); }
timeout $(box 150) python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
  tests/ops/test_cuda_fp8.py >$OUT/fp8_tests.log 2>&1
lap "fp8 tests rc=$?: $(grep -E 'passed|failed|error' $OUT/fp8_tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/fp8_tests.log | cut -c1-300 | head -12
timeout $(box 150) python3 tools/device/bench_fp8.py --rows 1,8 \
  --json $OUT/bench_fp8.json >$OUT/bench_fp8.log 2>&1
lap "bench_fp8 rc=$?"; python3 -c "
import json, sys
for line in filter(lambda l: l.startswith('{'), open(sys.argv[1])):
    r = json.loads(line); r.pop('tuning_ms', None); print(json.dumps(r)[:230])
" $OUT/bench_fp8.log 2>&1 | head -40
timeout $(box 280) python3 -m ninfer bench prefill,decode --device cuda --preset 27B \
  --quantization fp8 --prompt-tokens 8192 --batch-sizes 1,8 --json $OUT/fp8_27b.json \
  >$OUT/fp8_27b.log 2>&1
lap "27B fp8 rc=$?"; grep -v INFO $OUT/fp8_27b.log | grep -E "warm-up|│|rror" | cut -c1-200 | tail -16
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsA.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
