#!/usr/bin/env bash
# Device call M (carry .whl .fi_cache), for the next session: issue 37's goal rows on one call,
# with the FP8 head (`--draft-quantization fp8`, 0.26 ms a token less on the 9B in call K),
# a = 0.7, K = 3, batch 1, 1k context, plain decode in the same run. Goals on an H200: 27B
# <= 6.2 ms a token, 9B <= 2.2 ms, 35B-A3B >= 1.4x plain (H100, call K: 9.10, 3.28, 1.20x).
set -uo pipefail
source tools/device/env.sh  # B (default 570), lap, box
nvidia-smi --query-gpu=name --format=csv,noheader
for p in 27B 9B 35B-A3B; do
  timeout $(box 170) python3 -m ninfer.bench.spec_table --device cuda --draft-vocab 32768 \
    --preset $p --kv-capacity 24576 --contexts 1024 --batch-sizes 1 --acceptance 0.7 \
    --draft-quantization fp8 --json $OUT/spec_$p.json >$OUT/spec_$p.log 2>&1
  lap "$p rc=$?"; grep -E "^row: " $OUT/spec_$p.log | cut -c1-200 | tail -2
done
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsM.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
