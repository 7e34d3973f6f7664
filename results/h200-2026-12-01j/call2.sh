#!/usr/bin/env bash
# Device call 2 (tree 98a17f2 = 6cb1569 + docs, exported to the ignored .base/ and carried): the
# CUDA soak of issue 24, after the demo model's FlashInfer JIT modules; then the caches are saved.
set -uo pipefail
source tools/device/env.sh
cd .base && export PYTHONPATH=/tmp/site:$PWD
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
timeout 420 python3 tools/soak.py --device cuda --requests 3000 --report-every 20 \
  --json $OUT/soak.json >$OUT/soak.log 2>&1
lap "soak rc=$?"; grep -v flashinfer.jit $OUT/soak.log | tail -30
cd .. && save_caches >/dev/null; lap saved
