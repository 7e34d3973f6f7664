#!/usr/bin/env bash
# Device call E4 (the machine E3 left warm, the server's wheels carried): issue 41's bystander
# bench, then issue 39's cached-turn TTFT on the 9B.
set -uo pipefail
B=${B:-300}
python3 -c "import zipfile,glob; [zipfile.ZipFile(w).extractall('/tmp/site') for w in glob.glob('.whl_srv/*')]"
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
timeout 130 python3 -m ninfer.bench.bystander --device cuda --stall-trace $OUT/stalls.json >$OUT/bystander.json 2>$OUT/bystander.err
lap "bystander rc=$?"; tail -c 1500 $OUT/bystander.json; grep -v INFO $OUT/bystander.err | tail -4
s=$(left); [ "$s" -gt 40 ] && timeout $((s - 5)) python3 -m ninfer bench ttft --device cuda --preset 9B \
  --prompt-tokens 8192 --turns 4 --json $OUT/ttft_9b.json >$OUT/ttft_9b.log 2>&1
lap "ttft rc=$?"; grep -v INFO $OUT/ttft_9b.log | cut -c1-220 | tail -16
