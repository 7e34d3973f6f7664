#!/usr/bin/env bash
# Device call F1 (carry .whl and .whl_srv; no JIT cache carried): issue 41's bystander bench,
# then issue 39's cached-turn TTFT on the 9B (every turn shown), then the grown caches to $OUT.
set -uo pipefail
B=${B:-560}
python3 -c "import zipfile,glob; [zipfile.ZipFile(w).extractall('/tmp/site') for w in glob.glob('.whl_srv/*')]"
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
timeout 200 python3 -m ninfer.bench.bystander --device cuda --stall-trace $OUT/stalls.json >$OUT/bystander.json 2>$OUT/bystander.err
lap "bystander rc=$?"; tail -c 2500 $OUT/bystander.json; echo; grep -v INFO $OUT/bystander.err | tail -6
s=$(left); [ "$s" -gt 60 ] && timeout $((s - 40)) python3 -m ninfer bench ttft --device cuda --preset 9B \
  --prompt-tokens 8192 --turns 4 --json $OUT/ttft_9b.json >$OUT/ttft_9b.log 2>&1
lap "ttft rc=$?"; grep -v INFO $OUT/ttft_9b.log | cut -c1-220 | tail -24
save_caches >/dev/null 2>&1; ls -la $OUT | tail -8; lap done
