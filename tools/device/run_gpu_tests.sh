#!/usr/bin/env bash
# Runs on the device machine, in the repository root: unpacks the carried wheels (.whl/) and JIT
# caches (.fi_cache/), warms FlashInfer's JIT and fla's autotune in parallel processes, runs the
# GPU op tests, then tools/device/bench_ops.py. Logs, bench.json and the caches go to $OUT.
# Usage (the `run` tool, carry [".whl", ".fi_cache"]):
#   [SKIP_WARM=1] [BENCH_SECTIONS=attention,gdn,conv,copies] bash tools/device/run_gpu_tests.sh [-k expr]
# then copy $OUT's flashinfer.tgz and triton.tgz into .fi_cache/ for the next call.
set -uo pipefail
python3 -c "import zipfile,glob; [zipfile.ZipFile(w).extractall('/tmp/site') for w in glob.glob('.whl/*')]"
# unzip stamps files with the current time; older stamps keep ninja from rebuilding the carried
# FlashInfer JIT cache (it would otherwise see every header as newer than the cached objects)
find /tmp/site -exec touch -h -d 2020-01-01 {} +
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a
for f in .fi_cache/flashinfer.tgz .fi_cache/triton.tgz; do [ -f "$f" ] && tar xzf "$f" -C ~; done
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader
start=$(date +%s)
warm() { python3 tools/device/bench_ops.py --warm "$1" >"/tmp/warm-$1.log" 2>&1; echo "warm $1 rc=$?"; }
if [ -z "${SKIP_WARM:-}" ]; then  # SKIP_WARM=1 when the carried caches already hold everything
  for w in prefill-bf16 prefill-fp8 decode-bf16 decode-fp8; do warm "$w" & done  # nvcc, parallel
  for w in gdn-27B gdn-9B; do warm "$w"; done  # fla autotune, one at a time
  wait
  cat /tmp/warm-*.log >"$OUT/warm.log"
fi
echo "warm-up $(($(date +%s) - start)) s"
python3 -m pytest -q -p no:cacheprovider tests/ops/test_cuda_ops.py -rA --durations=5 "$@" 2>&1 |
  tee "$OUT/tests.log" | tail -40
python3 tools/device/bench_ops.py --out "$OUT/bench.json" \
  --sections "${BENCH_SECTIONS:-attention,gdn,conv,copies}" >"$OUT/bench.log" 2>&1
echo "bench rc=$?"; tail -5 "$OUT/bench.log"
tar czf "$OUT/flashinfer.tgz" -C ~ .cache/flashinfer 2>/dev/null
tar czf "$OUT/triton.tgz" -C ~ .triton 2>/dev/null
ls -la "$OUT"
