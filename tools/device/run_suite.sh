#!/usr/bin/env bash
# Runs on the device machine, in the repository root (the `run` tool, carry [".whl", ".fi_cache"]):
# unpacks the wheels and carried JIT caches (env.sh), warms FlashInfer's JIT (four modules in
# parallel) and fla's autotune, then runs the GPU test files named in GPU_TESTS (default: every
# GPU test file but the long skinny-GEMM sweep), each under its own timeout, and writes the
# grown caches to $OUT for the next call. The test logs go to $OUT/tests.log.
#   [GPU_TESTS="tests/ops/test_cuda_ops.py ..."] [TEST_TIMEOUT=200] [SKIP_WARM=1] \
#     bash tools/device/run_suite.sh
# then, here: replace .fi_cache/ by $OUT's flashinfer.tgz.part-* and triton.tgz.part-* files.
set -uo pipefail
source tools/device/env.sh
start=$(date +%s)
warm() { timeout 200 python3 tools/device/bench_ops.py --warm "$1" >"/tmp/warm-$1.log" 2>&1; echo "warm $1 rc=$?"; }
if [ -z "${SKIP_WARM:-}" ]; then
  for w in prefill-bf16 prefill-fp8 decode-bf16 decode-fp8; do warm "$w" & done  # nvcc, parallel
  for w in gdn-27B gdn-9B; do warm "$w"; done  # fla autotune, one at a time
  wait
fi
echo "warm-up $(($(date +%s) - start)) s"
tests=${GPU_TESTS:-"tests/ops/test_cuda_ops.py tests/ops/test_cuda_glue.py tests/ops/test_cuda_moe.py tests/engine/test_engine_cuda.py tests/engine/test_graph_metadata.py tests/engine/test_engine_host_cuda.py tests/memory/test_transfer.py tests/test_sampling.py"}
for t in $tests; do
  name=$(basename "$t" .py)
  timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
    --durations=8 "$t" >"/tmp/$name.log" 2>&1
  rc=$?
  { echo "=== $t rc=$rc"; cat "/tmp/$name.log"; } >>"$OUT/tests.log"  # one file: $OUT returns 8
  echo "$name rc=$rc at $(($(date +%s) - start)) s: $(grep -E 'passed|failed|error' "/tmp/$name.log" | tail -1)"
done
[ -n "${NO_SAVE:-}" ] || save_caches >/dev/null
echo "suite done at $(($(date +%s) - start)) s"
