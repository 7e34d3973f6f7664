#!/usr/bin/env bash
# Device call F (carry .whl .fi_cache), fourteenth session. The GPU tests of the thirteenth
# session's unrun kernels (conv state taps in one launch, the activation scale as torch's CUDA
# division computes it, the MoE decode kernels up to 256 routed pairs, the fused FP8 MoE block)
# and of 80bdb0a (every decode kernel's autotune timed in a CUDA graph with a cold L2); then
# the 27B FP8 decode at batch 1 and 8 beside bf16 (12.7 / 16.9 ms in 2026-12-07d's call A2,
# eager-timed configs), and the 35B-A3B FP8 decode at batch 1 (4.6 ms before the fused block).
set -uo pipefail
source tools/device/env.sh  # B (default 570), lap, box
nvidia-smi --query-gpu=name --format=csv,noheader
timeout $(box 240) python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
  tests/ops/test_cuda_state_taps.py tests/ops/test_cuda_fp8.py tests/ops/test_cuda_moe.py \
  tests/ops/test_cuda_skinny.py tests/engine/test_speculative_cuda.py \
  tests/engine/test_engine_cuda.py >$OUT/tests.log 2>&1
lap "tests rc=$?: $(grep -E 'passed|failed|error' $OUT/tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/tests.log | cut -c1-300 | head -12
timeout $(box 170) python3 -m ninfer bench decode --device cuda --preset 27B \
  --quantization fp8 --prompt-tokens 1024 --batch-sizes 1,8 --json $OUT/fp8_27b.json \
  >$OUT/fp8_27b.log 2>&1
lap "27B fp8 rc=$?"; grep -v INFO $OUT/fp8_27b.log | grep -E "warm-up|│|rror" | cut -c1-200 | tail -12
timeout $(box 140) python3 -m ninfer bench decode --device cuda --preset 35B-A3B \
  --quantization fp8 --no-baseline --prompt-tokens 1024 --batch-sizes 1,8 --json $OUT/fp8_35b.json \
  >$OUT/fp8_35b.log 2>&1
lap "35B fp8 rc=$?"; grep -v INFO $OUT/fp8_35b.log | grep -E "warm-up|│|rror" | cut -c1-200 | tail -12
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsF.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
