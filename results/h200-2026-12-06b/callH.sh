#!/usr/bin/env bash
# Device call H (carry .whl .whl_srv .fi_cache; the next session): the figures this session's
# last changes wait for, on the final tree: issue 39's nothing-cached turn (bench ttft, 9B; the
# off-grid tap's Triton variant now compiles in the warm-up) and issue 41's bystander gap (the
# wide reply's build, d0bec5a). A cold machine compiles every Triton kernel of this tree
# (call G1 spent its whole box on it): give the call 580 s and save the caches at the end.
set -uo pipefail
B=${B:-580}
python3 -c "import zipfile,glob; [zipfile.ZipFile(w).extractall('/tmp/site') for w in glob.glob('.whl_srv/*')]"
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 15 < want ? s - 15 : want )); }
timeout $(box 260) python3 -m ninfer bench ttft --device cuda --preset 9B --prompt-tokens 8192 \
  --turns 2 --json $OUT/ttft_9b.json >$OUT/ttft_9b.log 2>&1
lap "ttft rc=$?"; grep -v INFO $OUT/ttft_9b.log | cut -c1-160 | tail -9
timeout $(box 280) python3 -m ninfer.bench.bystander --device cuda --stall-trace $OUT/stalls.json \
  --server-log $OUT/server.log >$OUT/bystander.json 2>$OUT/bystander.err
lap "bystander rc=$?"; head -c 1500 $OUT/bystander.json; echo; grep -v INFO $OUT/bystander.err | tail -3
# at most 8 files come back: the logs in one archive, then the caches' parts
mkdir -p /tmp/logs && mv $OUT/*.log $OUT/*.err $OUT/stalls.json /tmp/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
