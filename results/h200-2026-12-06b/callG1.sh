#!/usr/bin/env bash
# Device call G1 (carry .whl .whl_srv .fi_cache): state taps off the chunk grid (exact taps in a
# pass), issue 36's last GPU file (tests/ops/test_cuda_ops.py,
# alone on the GPU), issue 39's structured-output GPU tests (jsonschema carried), issue 41's
# bystander bench on the GPU; then the grown JIT caches to $OUT.
set -uo pipefail
B=${B:-585}
python3 -c "import zipfile,glob; [zipfile.ZipFile(w).extractall('/tmp/site') for w in glob.glob('.whl_srv/*')]"
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 15 < want ? s - 15 : want )); }
run_file() { local name=$1 want=$2; shift 2; local s; s=$(box $want); [ "$s" -lt 15 ] && { lap "$name: no time left"; return; }
  timeout "$s" python3 -m pytest -q -p no:cacheprovider -o addopts="" -rsfE --durations=5 "$@" >$OUT/$name.log 2>&1
  local rc=$?; lap "$name rc=$rc: $(grep -E 'passed|failed|error|skipped' $OUT/$name.log | tail -1)"
  grep -E "^(FAILED|ERROR|SKIPPED)|^E  " $OUT/$name.log | cut -c1-300 | head -12; }
run_file state_taps 90 tests/ops/test_cuda_state_taps.py
run_file cuda_ops 280 tests/ops/test_cuda_ops.py
grep -A8 "slowest" $OUT/cuda_ops.log | cut -c1-160
run_file structured 80 tests/engine/test_structured_cuda.py tests/engine/test_thinking_budget_cuda.py
s=$(box 400); timeout $s python3 -m ninfer.bench.bystander --device cuda --stall-trace $OUT/stalls.json \
  --server-log $OUT/server.log >$OUT/bystander.json 2>$OUT/bystander.err
lap "bystander rc=$?"; tail -c 1800 $OUT/bystander.json; echo; grep -v INFO $OUT/bystander.err | tail -4
save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
