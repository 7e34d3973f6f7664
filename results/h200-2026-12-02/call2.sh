#!/usr/bin/env bash
# Device call 2 (sixteenth session): the two GPU test files call 1's time box did not reach
# (tests/ops/test_cuda_moe.py, tests/ops/test_cuda_ops.py) and, meanwhile, the engine mutation run
# that call 1 could not start (its mutmut wrapper was a symlink to the image's venv python,
# which then ran outside the venv). Carry [".whl", ".fi_cache", ".mwhl"].
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
GPU_TESTS="${GPU_TESTS:?}" \
  SKIP_WARM=1 NO_SAVE=1 TEST_TIMEOUT=${TEST_TIMEOUT:-150} timeout ${SUITE_SECONDS:-430} bash tools/device/run_suite.sh 2>&1 | grep -E "rc=|done"
lap "gpu tests"
wait $mpid
lap "all done"; tail -30 "$OUT/mut_engine.txt"
