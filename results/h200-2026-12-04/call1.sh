#!/usr/bin/env bash
# Device call 1 (issue 41): the bystander benchmark on a 16-core machine, server on the CPU and
# on the H200; FlashInfer/Triton caches saved for later calls.
set -uo pipefail
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
python3 -c "import fastapi, uvicorn, httpx; print('server deps ok')" || exit 3
timeout 200 python3 -m ninfer.bench.bystander --device cuda --hostile none > $OUT/by_cuda_none.json 2>$OUT/by_cuda_none.err
lap "cuda none rc=$?"; cat $OUT/by_cuda_none.json
timeout 200 python3 -m ninfer.bench.bystander --device cuda > $OUT/by_cuda_all.json 2>$OUT/by_cuda_all.err
lap "cuda all rc=$?"; cat $OUT/by_cuda_all.json
timeout 150 python3 -m ninfer.bench.bystander --device cpu > $OUT/by_cpu_all.json 2>$OUT/by_cpu_all.err
lap "cpu all rc=$?"; cat $OUT/by_cpu_all.json
save_caches
