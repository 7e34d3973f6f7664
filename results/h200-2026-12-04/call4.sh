#!/usr/bin/env bash
# Device call 4 (issue 36): the CUDA op tests on the tree without gdn_intra / gathered graphs and
# with one dtype table, and the engine GPU test files call 3 had no time for. Logs in one file.
set -uo pipefail
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
for t in tests/ops/test_cuda_ops.py tests/engine/test_engine_cuda_shapes.py \
    tests/engine/test_engine_pressure_cuda.py tests/engine/test_engine_cuda_warmup.py; do
  timeout 200 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE -x $t >/tmp/t.log 2>&1
  rc=$?; { echo "=== $t rc=$rc"; cat /tmp/t.log; } >>$OUT/tests.log
  lap "$t rc=$rc: $(grep -E 'passed|failed|error' /tmp/t.log | tail -1)"
done
