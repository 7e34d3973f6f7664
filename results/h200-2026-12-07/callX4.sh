#!/usr/bin/env bash
# Device call X4 (carry .whl .fi_cache), X3 cut to the device time left: the 9B MTP rows at
# 32k, batch 4 and 8, a = 0.7, that call X2 left without a window (8b07a28's fix).
set -uo pipefail
B=${B:-230}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
timeout $(( $(left) - 10 )) python3 -m ninfer.bench.spec_table --device cuda \
  --preset 9B --contexts 32768 --batch-sizes 4,8 --acceptance 0.7 \
  --draft-vocab 32768 --json $OUT/spec_table_9B_32k.json >$OUT/spec_table_9B_32k.log 2>&1
lap "9B 32k rc=$?"; grep "│" $OUT/spec_table_9B_32k.log | tail -4
