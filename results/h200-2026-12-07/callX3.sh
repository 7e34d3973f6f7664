#!/usr/bin/env bash
# Device call X3 (carry .whl .fi_cache, call X2's caches): the 9B MTP rows at 32k that call X2
# left without a window (batch 4 and 8; the bench now counts K + 1 tokens a step of the
# staggered start), then the 27B at 1k, batch 1 and 8, verify attention on fa2.
set -uo pipefail
B=${B:-420}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 15 < want ? s - 15 : want )); }
timeout $(box 190) python3 -m ninfer.bench.spec_table --device cuda \
  --preset 9B --contexts 32768 --batch-sizes 4,8 --acceptance 0.7,0.9 \
  --draft-vocab 32768 --json $OUT/spec_table_9B_32k.json >$OUT/spec_table_9B_32k.log 2>&1
lap "9B 32k rc=$?"; grep "│" $OUT/spec_table_9B_32k.log | tail -6
timeout $(box 230) python3 -m ninfer.bench.spec_table --device cuda \
  --preset 27B --contexts 1024 --batch-sizes 1,8 --acceptance 0.7,0.9 \
  --draft-vocab 32768 --json $OUT/spec_table_27B.json >$OUT/spec_table_27B.log 2>&1
lap "27B rc=$?"; grep "│" $OUT/spec_table_27B.log | tail -6
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsX3.tgz -C /tmp logs; ls $OUT | tr '\n' ' '; lap done
