#!/usr/bin/env bash
# Device call 2 (issue 41): the bystander benchmark after gc.freeze, with the stall trace;
# the server on the H200 and on the CPU (16 cores).
set -uo pipefail
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
for dev in cuda cpu; do
  timeout 280 python3 -m ninfer.bench.bystander --device $dev --stall-trace $OUT/stalls_$dev.json \
    --server-log $OUT/server_$dev.log > $OUT/by_$dev.json 2>$OUT/by_$dev.err
  lap "$dev rc=$?"; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d['stall_trace'].pop('worst_stalls',None); print(json.dumps(d))" $OUT/by_$dev.json
done
tail -3 $OUT/server_cuda.log
save_caches
