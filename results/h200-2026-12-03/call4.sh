#!/usr/bin/env bash
# Device call 4 of 2026-12-03: the PROMPT_END resume on CUDA equals a cold run (graph-replayed
# final chunk, and an eager solo pass with an in-pass tap), beside the cached-resume test.
set -uo pipefail
source tools/device/env.sh
timeout 420 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE tests/engine/test_engine_cuda.py \
  -k "prompt_end or cached_resume or in_pass_tap" 2>&1 | tail -15
