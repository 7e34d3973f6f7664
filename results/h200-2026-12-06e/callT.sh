#!/usr/bin/env bash
# Device call T (the next session; carry .whl .fi_cache): the speculative GPU tests on the
# tree whose sampled lanes also draft and accept on the device (63c96e4, cb0e634: not yet run
# on a GPU), the device acceptance rule on CUDA, then issue 37's table for one model with the
# trimmed draft head: MTP beside plain decode at acceptance 0.5, 0.7, 0.9, batch 1, 4, 8.
# MODEL=9B (default) | 27B | 35B-A3B; CONTEXTS=1024 (default) or 32768 (one per call for 27B).
set -uo pipefail
B=${B:-580}; MODEL=${MODEL:-9B}; CONTEXTS=${CONTEXTS:-1024}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
  tests/engine/test_speculative_cuda.py tests/test_sampling_speculative.py >$OUT/spec_tests.log 2>&1
lap "spec tests rc=$?: $(grep -E 'passed|failed|error' $OUT/spec_tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/spec_tests.log | cut -c1-300 | head -12
timeout $((B - 30 - $(date +%s) + t0)) python3 -m ninfer.bench.spec_table --device cuda \
  --preset "$MODEL" --contexts "$CONTEXTS" --batch-sizes 1,4,8 --acceptance 0.5,0.7,0.9 \
  --draft-vocab 32768 --json $OUT/spec_table_$MODEL.json >$OUT/spec_table_$MODEL.log 2>&1
lap "spec_table rc=$?"; grep -v INFO $OUT/spec_table_$MODEL.log | tail -40
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
