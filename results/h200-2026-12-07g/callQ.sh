#!/usr/bin/env bash
# Device call Q (carry .whl .fi_cache), sixteenth session: call P cut to what a short call
# holds. The new A8 configs' GPU tests; the per-shape race of the A8 and BITS configs at the
# 27B's shapes (bench_fp8 --a8, M = 1 and 8); then the 27B FP8 decode at batch 1 and 8 with
# `--fp8-decode fastest` (w8a16 on an H100 in 2026-12-07f call I: 12.69 / 13.84 ms a step).
set -uo pipefail
source tools/device/env.sh  # B (default 570), lap, box
nvidia-smi --query-gpu=name --format=csv,noheader
timeout $(box 110) python3 -m pytest -q $XDIST -p no:cacheprovider -o addopts="" -rfE \
  tests/ops/test_cuda_fp8.py -k "a8 or acts or fp8_decode" >$OUT/tests.log 2>&1
lap "tests rc=$?: $(grep -E 'passed|failed|error' $OUT/tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/tests.log | cut -c1-300 | head -12
timeout $(box 130) python3 tools/device/bench_fp8.py --no-prefill --rows 1,8 --a8 \
  --json $OUT/a8.json >$OUT/a8.log 2>&1
lap "bench_fp8 --a8 rc=$?"; python3 - $OUT/a8.json <<'PY' 2>&1 | tail -30
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("impl", "").startswith("fp8-best") or r.get("impl") in ("fp8", "bf16"):
        print(r["set"], "M", r["M"], r["impl"], "us", r["us"], "of_copy", r["of_copy"],
              "err", r.get("rel_err"), "A8" if (r.get("config") or {}).get("A8") else "")
PY
timeout $(box 170) python3 -m ninfer bench decode --device cuda --preset 27B \
  --quantization fp8 --fp8-decode fastest --no-baseline --prompt-tokens 1024 --batch-sizes 1,8 \
  --json $OUT/fp8_27b_fastest.json >$OUT/fp8_27b_fastest.log 2>&1
lap "27B fp8 fastest rc=$?"
grep -v INFO $OUT/fp8_27b_fastest.log | grep -E "warm-up|│|rror" | cut -c1-200 | tail -8
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsQ.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
