#!/usr/bin/env bash
# Device call W (carry .whl .fi_cache): callT.sh's GPU tests alone, for a session with about
# 300 s of device time left (the code no GPU has run yet: the N40 MoE block oracle, the A8
# decode configs with x quantised by one pre-hook launch, grammar and logprobs rows in the
# speculator's verify graphs, image requests with MTP). No figures, no caches written back.
set -uo pipefail
source tools/device/env.sh  # B, lap, box
timeout $(box 260) python3 -m pytest -q $XDIST -p no:cacheprovider -o addopts="" -rfE \
  tests/ops/test_cuda_fp8.py tests/engine/test_speculative_cuda.py \
  tests/vision/test_engine_images_cuda.py \
  -k "a8 or acts or fp8_decode or graph_replays or parts_at_40 or shared_expert or grammar_and_logprobs or mtp_speculation" \
  >$OUT/testsW.log 2>&1
lap "tests rc=$?: $(grep -E 'passed|failed|error' $OUT/testsW.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/testsW.log | cut -c1-300 | head -16
