#!/usr/bin/env bash
# Device call S (carry .whl .fi_cache), for the next session: the A8 configs as the sixteenth
# session leaves them: x quantised by one `quant_groups_into` launch (the config's pre-hook),
# then e4m3 x e4m3 on wgmma, both operands streamed by cp.async (call R's in-kernel
# quantisation read 0.21-0.60 of the copy rate against BITS's 0.62-0.87). Their GPU tests;
# the race of best A8 against best BITS at all six 27B shapes (bench_fp8 --a8, M = 1 and 8);
# then the 27B FP8 decode at batch 1 and 8 with `--fp8-decode fastest`, and with the default
# w8a16 beside it.
set -uo pipefail
source tools/device/env.sh  # B (default 570), lap, box
nvidia-smi --query-gpu=name --format=csv,noheader
timeout $(box 120) python3 -m pytest -q $XDIST -p no:cacheprovider -o addopts="" -rfE \
  tests/ops/test_cuda_fp8.py -k "a8 or acts or fp8_decode or every_skinny or graph_replays or parts_at_40" >$OUT/tests.log 2>&1
lap "tests rc=$?: $(grep -E 'passed|failed|error' $OUT/tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/tests.log | cut -c1-300 | head -12
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
for acts in fastest w8a16; do
  timeout $(box 140) python3 -m ninfer bench decode --device cuda --preset 27B \
    --quantization fp8 --fp8-decode $acts --no-baseline --prompt-tokens 1024 --batch-sizes 1,8 \
    --json $OUT/fp8_27b_$acts.json >$OUT/fp8_27b_$acts.log 2>&1
  lap "27B fp8 $acts rc=$?"
  grep -v INFO $OUT/fp8_27b_$acts.log | grep -E "│|rror" | cut -c1-200 | tail -6
done
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsS.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
