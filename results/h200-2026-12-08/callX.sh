#!/usr/bin/env bash
# Device call X (carry .whl, and .fi_cache on a cold machine): callW.sh's GPU tests (the code
# no GPU has run yet: the N40 MoE block oracle, the A8 decode configs with x quantised by one
# pre-hook launch, grammar and logprobs rows in the verify graphs, images with MTP) and the
# graph route's head-fault containment (`Speculator._contained_ahead`); then issue 38's goal
# figures with the default decode (w8a16), as callT.sh: the 27B FP8 8k prefill (<= 470 ms on
# an H200) and decode at batch 1 and 8 (>= 0.85 / 0.8 of the bound), the 35B-A3B FP8 decode
# at batch 1 (>= 0.5).
set -uo pipefail
source tools/device/env.sh  # B (default 570), lap, box
nvidia-smi --query-gpu=name --format=csv,noheader
timeout $(box 220) python3 -m pytest -q $XDIST -p no:cacheprovider -o addopts="" -rfE \
  tests/ops/test_cuda_fp8.py tests/engine/test_speculative_cuda.py \
  tests/vision/test_engine_images_cuda.py \
  -k "a8 or acts or fp8_decode or graph_replays or parts_at_40 or shared_expert or grammar_and_logprobs or mtp_speculation or head_faults_on_the_graph" \
  >$OUT/tests.log 2>&1
lap "tests rc=$?: $(grep -E 'passed|failed|error' $OUT/tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/tests.log | cut -c1-300 | head -16
timeout $(box 190) python3 -m ninfer bench prefill,decode --device cuda --preset 27B \
  --quantization fp8 --no-baseline --prompt-tokens 8192 --batch-sizes 1,8 \
  --json $OUT/fp8_27b.json >$OUT/fp8_27b.log 2>&1
lap "27B fp8 rc=$?"; grep -v INFO $OUT/fp8_27b.log | grep -E "warm-up|│|rror" | cut -c1-200 | tail -10
timeout $(box 130) python3 -m ninfer bench decode --device cuda --preset 35B-A3B \
  --quantization fp8 --no-baseline --prompt-tokens 1024 --batch-sizes 1 \
  --json $OUT/fp8_35b.json >$OUT/fp8_35b.log 2>&1
lap "35B fp8 rc=$?"; grep -v INFO $OUT/fp8_35b.log | grep -E "warm-up|│|rror" | cut -c1-200 | tail -6
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsX.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
