#!/usr/bin/env bash
# Device call X5 (carry .whl .fi_cache): the bf16 skinny GEMM taken up to 16 rows (a verify
# pass at batch 2-4 with K = 3), its GPU tests, then the 9B MTP rows at batch 2 and 4 (1k,
# a = 0.7), where the decode linear race now has the skinny kernel to choose at M = 8..16.
set -uo pipefail
B=${B:-240}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 10 < want ? s - 10 : want )); }
timeout $(box 80) python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
  tests/ops/test_cuda_skinny.py >$OUT/skinny_tests.log 2>&1
lap "skinny tests rc=$?: $(grep -E 'passed|failed|error' $OUT/skinny_tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/skinny_tests.log | cut -c1-200 | head -6
timeout $(box 150) python3 -m ninfer.bench.spec_table --device cuda \
  --preset 9B --contexts 1024 --batch-sizes 2,4 --acceptance 0.7 \
  --draft-vocab 32768 --json $OUT/spec_table_9B_b24.json >$OUT/spec_table_9B_b24.log 2>&1
lap "9B b2,4 rc=$?"; grep "│" $OUT/spec_table_9B_b24.log | tail -4
