#!/usr/bin/env bash
# Device call J (carry .whl .fi_cache): where a speculative step of the 9B spends its time
# with the speculator's graphs (tools/device/profile_spec.py, controlled acceptance 0.7, K = 3),
# batch 1 and 8; then the caches (Triton, FlashInfer, inductor) for the next cold machine.
set -uo pipefail
B=${B:-480}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 40 < want ? s - 40 : want )); }
for bs in 1 8; do
  timeout $(box 200) python3 tools/device/profile_spec.py --preset 9B --batch $bs \
    --trace $OUT/spec_b$bs.json.gz >$OUT/profile_b$bs.log 2>&1
  lap "profile b$bs rc=$?"; grep -v -E "INFO|USDT" $OUT/profile_b$bs.log | cut -c1-130 | head -60
  rm -f $OUT/spec_b$bs.json
done
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
