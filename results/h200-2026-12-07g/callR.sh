#!/usr/bin/env bash
# Device call R (carry .whl .fi_cache), sixteenth session: call Q cut to a few minutes of
# device time. The A8 configs' GPU tests (x quantised in the GEMV as prefill quantises it, the
# product W x^T on sm_90's wgmma e4m3), then the race of the best A8 and best BITS configs at
# three of the 27B's shapes (bench_fp8 --a8, M = 1 and 8).
set -uo pipefail
source tools/device/env.sh  # B (default 570), lap, box
nvidia-smi --query-gpu=name --format=csv,noheader
timeout $(box 110) python3 -m pytest -q $XDIST -p no:cacheprovider -o addopts="" -rfE \
  tests/ops/test_cuda_fp8.py -k "a8 or acts or fp8_decode" >$OUT/tests.log 2>&1
lap "tests rc=$?: $(grep -E 'passed|failed|error' $OUT/tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/tests.log | cut -c1-300 | head -12
timeout $(box 150) python3 tools/device/bench_fp8.py --no-prefill --rows 1,8 --a8 \
  --shapes "attn o,mlp gate|up,mlp down" --json $OUT/a8.json >$OUT/a8.log 2>&1
lap "bench_fp8 --a8 rc=$?"; python3 - $OUT/a8.json <<'PY' 2>&1 | tail -30
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("impl", "").startswith("fp8-best") or r.get("impl") in ("fp8", "bf16"):
        print(r["set"], "M", r["M"], r["impl"], "us", r["us"], "of_copy", r["of_copy"],
              "err", r.get("rel_err"), "A8" if (r.get("config") or {}).get("A8") else "")
PY
tail -5 $OUT/a8.log | cut -c1-300
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsR.tgz -C /tmp logs; ls $OUT | tr '\n' ' '; lap done
