#!/usr/bin/env bash
# Device call 7 (issue 36): the skinny-GEMM and MoE op tests; the JIT caches saved for the next
# call. One log: $OUT/call7.log.
set -uo pipefail
source tools/device/env.sh
L=$OUT/call7.log
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*" | tee -a $L; }
run() {  # run FILE TIMEOUT
  timeout $2 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE $1 >/tmp/t.log 2>&1
  rc=$?; { echo "=== $1 rc=$rc"; tail -30 /tmp/t.log; } >>$L
  lap "$1 rc=$rc: $(grep -E 'passed|failed|error' /tmp/t.log | tail -1)"
}
run tests/ops/test_cuda_skinny.py 150
run tests/ops/test_cuda_moe.py 240
save_caches >/dev/null
lap done
