#!/usr/bin/env bash
# Device call Y2 (carry .whl .fi_cache, call Y1's caches): issue 37's table for the 27B at 1k
# (batch 1, 4, 8; a = 0.5, 0.7, 0.9), verify attention on fa2, draft head trimmed to 32768 ids;
# then, if B leaves room, the 35B-A3B at 1k (never measured with MTP) and the 27B at 32k. One
# bench run per block, so that a time box loses only its own rows.
set -uo pipefail
B=${B:-570}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 20 < want ? s - 20 : want )); }
table() {  # name, box, args...
  local name=$1 want=$2; shift 2
  timeout $(box $want) python3 -m ninfer.bench.spec_table --device cuda --draft-vocab 32768 \
    --json $OUT/spec_table_$name.json "$@" >$OUT/spec_table_$name.log 2>&1
  lap "$name rc=$?"; grep "│" $OUT/spec_table_$name.log | tail -13
}
table 27B_1k 270 --preset 27B --contexts 1024 --batch-sizes 1,4,8 --acceptance 0.5,0.7,0.9
[ $(left) -gt 150 ] && table 35B_1k 150 --preset 35B-A3B --contexts 1024 --batch-sizes 1,8 --acceptance 0.7,0.9
[ $(left) -gt 150 ] && table 27B_32k 200 --preset 27B --contexts 32768 --batch-sizes 1,8 --acceptance 0.7
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsY2.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
