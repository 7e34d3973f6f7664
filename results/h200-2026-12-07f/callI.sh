#!/usr/bin/env bash
# Device call I (carry .whl .fi_cache), fifteenth session: the FP8 GEMV's BITS configs (e4m3
# widened by integer ops and a bf16x2 multiply instead of the conversion unit's cvt pair; the
# sm_90 SASS of a DOT config loses its 64 F2F and 34 F2FP a step). First the skinny GPU tests
# (every config, every e4m3 byte exact), then every config's graph-timed autotune figure at the
# 27B's shapes (bench_fp8's tuning_ms: best BITS against best conversion config), then the 27B
# FP8 decode at batch 1 and 8 (12.86 / 14.56 ms on an H100 in 2026-12-07e).
set -uo pipefail
source tools/device/env.sh  # B (default 570), lap, box
nvidia-smi --query-gpu=name --format=csv,noheader
# the tests first, in 12 processes (pytest-xdist from .whl/): a changed kernel source compiles
# every config again, and the bench below then finds them in the Triton cache
timeout $(box 200) python3 -m pytest -q $XDIST -p no:cacheprovider -o addopts="" -rfE \
  tests/ops/test_cuda_fp8.py -k "skinny or decode_linear" >$OUT/tests.log 2>&1
lap "tests rc=$?: $(grep -E 'passed|failed|error' $OUT/tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/tests.log | cut -c1-300 | head -12
timeout $(box 160) python3 tools/device/bench_fp8.py --no-prefill --rows 1,8 \
  --json $OUT/bits.json >$OUT/bits.log 2>&1
lap "bench_fp8 rc=$?"; python3 - $OUT/bits.json <<'PY' 2>&1 | tail -16
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "tuning_ms" not in r:
        continue
    t = r["tuning_ms"]
    bits = {c: v for c, v in t.items() if "'BITS': True" in c}
    conv = {c: v for c, v in t.items() if "'BITS': False" in c}
    b, c = min(bits, key=bits.get), min(conv, key=conv.get)
    print(r["set"], "M", r["M"], "us", r["us"], "of_copy", r["of_copy"], "best bits",
          round(bits[b] * 1e3, 1), "best cvt", round(conv[c] * 1e3, 1), "chosen", r["config"])
PY
timeout $(box 200) python3 -m ninfer bench decode --device cuda --preset 27B \
  --quantization fp8 --no-baseline --prompt-tokens 1024 --batch-sizes 1,8 \
  --json $OUT/fp8_27b.json >$OUT/fp8_27b.log 2>&1
lap "27B fp8 rc=$?"; grep -v INFO $OUT/fp8_27b.log | grep -E "warm-up|│|rror" | cut -c1-200 | tail -10
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsI.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
