#!/usr/bin/env bash
# Device call 1 of the fifteenth session (tree 6cb1569): the "before" engine benchmark for the
# renovation (issue 25), the CUDA soak (issue 24), the server benchmark (issue 26).
set -uo pipefail
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
lap "bench prefill,decode (before)"
timeout 170 python3 -m ninfer bench prefill,decode --device cuda --preset 9B \
  --prompt-tokens 1024,8192 --batch-sizes 1,4,8 --json $OUT/bench_before.json >$OUT/bench_before.log 2>&1
lap "bench rc=$?"
timeout 160 python3 tools/soak.py --device cuda --requests 4000 --report-every 15 \
  --json $OUT/soak.json >$OUT/soak.log 2>&1
lap "soak rc=$?"; tail -3 $OUT/soak.log
timeout 100 python3 tools/bench_serve.py --inprocess --preset 9B --device cuda \
  --json $OUT/inproc.json >$OUT/inproc.log 2>&1
lap "inproc rc=$?"
python3 -m ninfer serve --preset 9B --port 8000 >$OUT/serve.log 2>&1 &
spid=$!
for i in $(seq 1 60); do grep -q "127.0.0.1:8000/v1" $OUT/serve.log && break; sleep 1; done
lap "server up"
timeout 100 python3 tools/bench_serve.py --url http://127.0.0.1:8000 --compare $OUT/inproc.json \
  --json $OUT/server.json >$OUT/server.log 2>&1
lap "server bench rc=$?"
kill -TERM $spid; wait $spid; lap "server exit rc=$?"
tail -25 $OUT/server.log
