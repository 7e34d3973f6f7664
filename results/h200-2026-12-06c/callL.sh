#!/usr/bin/env bash
# Device call L (the next session; carry .whl .fi_cache): issue 37's speed table for one model,
# MTP beside plain decode at contexts 1k and 32k, batch 1, 4, 8, acceptance 0.5, 0.7, 0.9.
# MODEL=9B (default) | 27B | 35B-A3B; CONTEXTS=1024,32768 (a 27B call may need one context
# per call to fit its 600 s box).
set -uo pipefail
B=${B:-580}; MODEL=${MODEL:-9B}; CONTEXTS=${CONTEXTS:-1024,32768}
source tools/device/env.sh
t0=$(date +%s)
timeout $((B - 30)) python3 -m ninfer.bench.spec_table --device cuda --preset "$MODEL" \
  --contexts "$CONTEXTS" --batch-sizes 1,4,8 --acceptance 0.5,0.7,0.9 \
  --json "$OUT/spec_table_$MODEL.json" >"$OUT/spec_table_$MODEL.log" 2>&1
echo "[$(($(date +%s) - t0)) s] rc=$?"; grep -v INFO "$OUT/spec_table_$MODEL.log" | tail -40
save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '
