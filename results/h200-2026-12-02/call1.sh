#!/usr/bin/env bash
# Device call 1 (sixteenth session): the GPU tests not yet run on the renovated tree (issue 25),
# the new CUDA seeded-sampling rewind test, a short tools/device/bench_engine.py pass over its
# per-choice runners; meanwhile, on the CPU cores (CUDA hidden, nice 19), the mutation run of the
# engine's cache-decision modules (issue 28), its verdicts tarred to $OUT for a later -k run.
# Carry [".whl", ".fi_cache", ".mwhl"] (.mwhl: mutmut 3.8.1 and the deps the image lacks).
set -uo pipefail
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/msite .mwhl/*.whl
mkdir -p /tmp/mbin && printf '#!/bin/sh\nexec python3 "$@"\n' >/tmp/mbin/python && chmod +x /tmp/mbin/python
printf '#!/bin/sh\nexec /tmp/mbin/python -m mutmut "$@"\n' >/tmp/mbin/mutmut && chmod +x /tmp/mbin/mutmut
(
  CUDA_VISIBLE_DEVICES="" PYTHONPATH=/tmp/msite PYTHON=/tmp/mbin/python \
    bash tools/mutation.sh -g engine -j "${MUT_JOBS:-12}" -t "${MUT_SECONDS:-460}" >"$OUT/mut_engine.txt" 2>&1
  (cd .mutation/engine && find mutants -name '*.meta' -o -name 'mutmut-stats.json' | tar czf "$OUT/mut_engine.tgz" -T -)
  echo "[$(($(date +%s) - t0)) s] mutation done"
) &
mpid=$!
source tools/device/env.sh
lap "env"
GPU_TESTS="tests/engine/test_faults_cuda.py tests/memory/test_transfer.py tests/engine/test_engine_cuda_shapes.py tests/engine/test_engine_pressure_cuda.py tests/ops/test_cuda_glue.py tests/ops/test_cuda_moe.py tests/ops/test_cuda_ops.py" \
  SKIP_WARM=1 NO_SAVE=1 TEST_TIMEOUT=150 timeout 430 bash tools/device/run_suite.sh 2>&1 | grep -E "rc=|done"
lap "gpu tests"
timeout 90 python3 tools/device/bench_engine.py --models 0.8B --batches 1,8 --steps 16 \
  --prefill 0.8B:2048 --chunked 0.8B:8192:2048 --gather on,off --gdn-intra fla,ninfer \
  --compile-check "" --tap 0.8B --out $OUT/bench_engine.json >$OUT/bench_engine.log 2>&1
lap "bench_engine rc=$?"; grep -E "error|Traceback" $OUT/bench_engine.log | head -5
wait $mpid
lap "all done"; tail -30 "$OUT/mut_engine.txt"
