#!/usr/bin/env bash
# Device call 3 (the renovated tree): engine benchmark "after" (issue 25), GPU tests, TTFT per
# turn (issue 23), server vs in-process (issue 26), a soak with Host traffic (issue 24).
set -uo pipefail
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
timeout 170 python3 -m ninfer bench prefill,decode --device cuda --preset 9B \
  --prompt-tokens 1024,8192 --batch-sizes 1,4,8 --json $OUT/bench_after.json >$OUT/bench_after.log 2>&1
lap "bench rc=$?"; grep -E "^│ (1024|8192|1|4|8) |steady" $OUT/bench_after.log | head -12
GPU_TESTS="tests/engine/test_engine_cuda.py tests/engine/test_faults_cuda.py tests/engine/test_engine_host_cuda.py tests/engine/test_engine_cuda_warmup.py" \
  SKIP_WARM=1 NO_SAVE=1 TEST_TIMEOUT=130 bash tools/device/run_suite.sh 2>&1 | grep -E "rc=|done"
lap "gpu tests"
timeout 130 python3 -m ninfer bench ttft --device cuda --preset 9B --prompt-tokens 8192 --turns 6 \
  --json $OUT/ttft.json >$OUT/ttft.log 2>&1
lap "ttft rc=$?"
timeout 60 python3 tools/soak.py --device cuda --requests 3000 --kv-capacity 4096 --report-every 20 \
  --json $OUT/soak_kv4096.json >$OUT/soak_kv4096.log 2>&1
lap "soak rc=$?"; tail -4 $OUT/soak_kv4096.log
timeout 70 python3 tools/bench_serve.py --inprocess --preset 9B --device cuda \
  --json $OUT/inproc.json >$OUT/inproc.log 2>&1
lap "inproc rc=$?"
python3 -m ninfer serve --preset 9B --port 8000 >$OUT/serve.log 2>&1 &
spid=$!
for i in $(seq 1 60); do grep -q "127.0.0.1:8000/v1" $OUT/serve.log && break; sleep 1; done
timeout 80 python3 tools/bench_serve.py --url http://127.0.0.1:8000 --compare $OUT/inproc.json \
  --server-cpu --json $OUT/server.json >$OUT/server.log 2>&1
lap "server bench rc=$?"
kill -TERM $spid; wait $spid; tail -14 $OUT/server.log
