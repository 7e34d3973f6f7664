#!/usr/bin/env bash
# Device call O (carry .whl, and .fi_cache on a cold machine), sixteenth session: issue 38's
# goal figures with the default decode (w8a16): the 27B FP8 prefill of 8k tokens (<= 470 ms on
# an H200) and decode at batch 1 and 8 (>= 0.85 / 0.8 of the bound); the 35B-A3B FP8 decode at
# batch 1 with `--fp8-decode fastest` (>= 0.5; 0.40 with w8a16 on an H100); then issue 37's
# 27B row (a = 0.7, K = 3, the FP8 head; <= 6.2 ms a token on an H200).
set -uo pipefail
source tools/device/env.sh  # B (default 570), lap, box
nvidia-smi --query-gpu=name --format=csv,noheader
timeout $(box 200) python3 -m ninfer bench prefill,decode --device cuda --preset 27B \
  --quantization fp8 --no-baseline --prompt-tokens 8192 --batch-sizes 1,8 \
  --json $OUT/fp8_27b.json >$OUT/fp8_27b.log 2>&1
lap "27B fp8 rc=$?"; grep -v INFO $OUT/fp8_27b.log | grep -E "warm-up|│|rror" | cut -c1-200 | tail -10
timeout $(box 150) python3 -m ninfer bench decode --device cuda --preset 35B-A3B \
  --quantization fp8 --fp8-decode fastest --no-baseline --prompt-tokens 1024 --batch-sizes 1 \
  --json $OUT/fp8_35b_fastest.json >$OUT/fp8_35b.log 2>&1
lap "35B fp8 rc=$?"; grep -v INFO $OUT/fp8_35b.log | grep -E "warm-up|│|rror" | cut -c1-200 | tail -6
timeout $(box 170) python3 -m ninfer.bench.spec_table --device cuda --draft-vocab 32768 \
  --preset 27B --kv-capacity 24576 --contexts 1024 --batch-sizes 1 --acceptance 0.7 \
  --draft-quantization fp8 --json $OUT/spec_27B.json >$OUT/spec_27B.log 2>&1
lap "27B mtp rc=$?"; grep -E "^row: " $OUT/spec_27B.log | cut -c1-200 | tail -2
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsO.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
