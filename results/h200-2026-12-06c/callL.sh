#!/usr/bin/env bash
# Device call L (the next session; carry .whl .fi_cache): the speculative GPU tests, then
# issue 37's speed table for one model,
# MTP beside plain decode at contexts 1k and 32k, batch 1, 4, 8, acceptance 0.5, 0.7, 0.9.
# MODEL=9B (default) | 27B | 35B-A3B; CONTEXTS=1024,32768 (a 27B call may need one context
# per call to fit its 600 s box).
set -uo pipefail
B=${B:-580}; MODEL=${MODEL:-9B}; CONTEXTS=${CONTEXTS:-1024,32768}
source tools/device/env.sh
t0=$(date +%s)
# first the speculative GPU tests: the greedy chain fed on the device (c6ac63c) is not yet run
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
  tests/engine/test_speculative_cuda.py >"$OUT/spec_tests.log" 2>&1
rc=$?; echo "[$(($(date +%s) - t0)) s] spec tests rc=$rc: $(grep -E 'passed|failed' "$OUT/spec_tests.log" | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " "$OUT/spec_tests.log" | cut -c1-300 | head -12
timeout $((B - 30 - $(date +%s) + t0)) python3 -m ninfer.bench.spec_table --device cuda --preset "$MODEL" \
  --contexts "$CONTEXTS" --batch-sizes 1,4,8 --acceptance 0.5,0.7,0.9 \
  --json "$OUT/spec_table_$MODEL.json" >"$OUT/spec_table_$MODEL.log" 2>&1
rc=$?; echo "[$(($(date +%s) - t0)) s] spec_table rc=$rc"; grep -v INFO "$OUT/spec_table_$MODEL.log" | tail -40
save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '
