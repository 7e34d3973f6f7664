#!/usr/bin/env bash
# Device call X2 (carry .whl .fi_cache): issue 37's 9B table at 1k and 32k with the verify
# graphs' attention on fa2 (the default since call X1), then the 9B batch-1 steps timed by the
# drafts they accept (a = 0.7), to find why a verify step costs twice a plain one.
set -uo pipefail
B=${B:-600}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 20 < want ? s - 20 : want )); }
timeout $(box 360) python3 -m ninfer.bench.spec_table --device cuda \
  --preset 9B --contexts 1024,32768 --batch-sizes 1,4,8 --acceptance 0.5,0.7,0.9 \
  --draft-vocab 32768 --json $OUT/spec_table_9B.json >$OUT/spec_table_9B.log 2>&1
lap "spec_table rc=$?"; grep -v INFO $OUT/spec_table_9B.log | grep "│" | tail -40
timeout $(box 200) python3 tools/device/profile_spec.py --preset 9B --batch 1 --draft-vocab 32768 \
  --tokens 96 --no-profile >$OUT/profile.log 2>&1
lap "profile rc=$?"; grep -v -E "INFO|Warn|warn" $OUT/profile.log | tail -24
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsX2.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
