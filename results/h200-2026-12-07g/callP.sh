#!/usr/bin/env bash
# Device call P (carry .whl .fi_cache), sixteenth session, for one call where one may be all
# there is: the FP8 GEMV tests (stop 61's unrun changes and the new A8 configs), then the 27B
# FP8 decode at batch 1 and 8 with `--fp8-decode fastest` (A8 configs in the race) and with the
# default w8a16 beside it in the same machine, the latter with the 8k prefill (issue 38's goals
# on an H200: prefill <= 470 ms, decode >= 0.85 / 0.8 of the bound); then, with what is left,
# the per-shape race of the A8 and BITS configs (bench_fp8 --a8).
set -uo pipefail
source tools/device/env.sh  # B (default 570), lap, box
nvidia-smi --query-gpu=name --format=csv,noheader
timeout $(box 170) python3 -m pytest -q $XDIST -p no:cacheprovider -o addopts="" -rfE \
  tests/ops/test_cuda_fp8.py >$OUT/tests.log 2>&1
lap "tests rc=$?: $(grep -E 'passed|failed|error' $OUT/tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/tests.log | cut -c1-300 | head -12
for acts in fastest w8a16; do
  parts=decode; n=1024
  [ $acts = w8a16 ] && parts=prefill,decode && n=8192
  timeout $(box 170) python3 -m ninfer bench $parts --device cuda --preset 27B \
    --quantization fp8 --fp8-decode $acts --no-baseline --prompt-tokens $n --batch-sizes 1,8 \
    --json $OUT/fp8_27b_$acts.json >$OUT/fp8_27b_$acts.log 2>&1
  lap "27B fp8 $acts rc=$?"
  grep -v INFO $OUT/fp8_27b_$acts.log | grep -E "warm-up|│|rror" | cut -c1-200 | tail -8
done
timeout $(box 150) python3 tools/device/bench_fp8.py --no-prefill --rows 1,8 --a8 \
  --json $OUT/a8.json >$OUT/a8.log 2>&1
lap "bench_fp8 --a8 rc=$?"; python3 - $OUT/a8.json <<'PY' 2>&1 | tail -30
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("impl", "").startswith("fp8-best") or r.get("impl") in ("fp8", "bf16"):
        print(r["set"], "M", r["M"], r["impl"], "us", r["us"], "of_copy", r["of_copy"],
              "err", r.get("rel_err"), "A8" if (r.get("config") or {}).get("A8") else "")
PY
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsP.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
