#!/usr/bin/env bash
# Device call 6 (issue 36): the GPU test files call 5 had no time for, then the CUDA op tests.
# One log: $OUT/call6.log.
set -uo pipefail
source tools/device/env.sh
L=$OUT/call6.log
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*" | tee -a $L; }
run() {  # run FILE TIMEOUT
  timeout $2 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE $1 >/tmp/t.log 2>&1
  rc=$?; { echo "=== $1 rc=$rc"; tail -30 /tmp/t.log; } >>$L
  lap "$1 rc=$rc: $(grep -E 'passed|failed|error' /tmp/t.log | tail -1)"
}
run tests/engine/test_engine_cuda_shapes.py 120
run tests/engine/test_engine_pressure_cuda.py 100
run tests/engine/test_engine_cuda_warmup.py 100
run tests/ops/test_cuda_glue.py 60
run tests/ops/test_cuda_skinny.py 60
run tests/ops/test_cuda_ops.py 330
lap done
