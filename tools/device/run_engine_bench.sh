#!/usr/bin/env bash
# Runs on the device machine, in the repository root: unpacks the carried wheels (.whl/) and JIT
# caches (.fi_cache/) as run_gpu_tests.sh does, runs the GPU engine tests, then
# tools/device/bench_engine.py (arguments passed through). Logs, bench_engine.json and the
# decode-step trace (prof/) go to $OUT.
# Usage (the `run` tool, carry [".whl", ".fi_cache"]):
#   [TEST_TIMEOUT=150] [BENCH_TIMEOUT=200] bash tools/device/run_engine_bench.sh [bench args]
set -uo pipefail
python3 -c "import zipfile,glob; [zipfile.ZipFile(w).extractall('/tmp/site') for w in glob.glob('.whl/*')]"
find /tmp/site -exec touch -h -d 2020-01-01 {} +  # keep ninja from rebuilding the JIT cache
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a
for f in .fi_cache/flashinfer.tgz .fi_cache/triton.tgz; do [ -f "$f" ] && tar xzf "$f" -C ~; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader
start=$(date +%s)
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider -rA --durations=6 \
  tests/engine/test_engine_cuda.py tests/engine/test_graph_metadata.py 2>&1 | tee "$OUT/tests.log"
echo "tests done at $(($(date +%s) - start)) s"
timeout "${BENCH_TIMEOUT:-200}" python3 tools/device/bench_engine.py \
  --out "$OUT/bench_engine.json" --profile "$OUT/prof" "$@" 2>&1 | tee "$OUT/bench.log"
echo "bench rc=$? total $(($(date +%s) - start)) s"
