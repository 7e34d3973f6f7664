#!/usr/bin/env bash
# Device call E (carry .whl .fi_cache), after call D has passed the GPU tests: issue 37's
# dense rows at 1k on the tree with the conv state taps in one launch each (890b5d1) and the
# verify rows' GDN gates inside `gdn_rows` (b455a9e), about ten launches less per GDN layer of
# a verify pass; then the 27B step kernel by kernel again (call B of this folder: verify replay
# 21.9 ms against plain decode's 19.0 on an H100). Plain decode in the same runs.
set -uo pipefail
source tools/device/env.sh  # B (default 570), lap, box
nvidia-smi --query-gpu=name --format=csv,noheader
for p in 9B 27B; do
  timeout $(box 190) python3 -m ninfer.bench.spec_table --device cuda --draft-vocab 32768 \
    --preset $p --contexts 1024 --batch-sizes 1,8 --acceptance 0.7,0.9 \
    --json $OUT/spec_table_${p}_1k.json >$OUT/spec_table_${p}_1k.log 2>&1
  lap "$p rc=$?"; grep -E "^row: |note" $OUT/spec_table_${p}_1k.log | cut -c1-250 | tail -6
done
timeout $(box 150) python3 tools/device/profile_spec.py --preset 27B --batch 1 --draft-vocab 32768 \
  --tokens 64 >$OUT/profile27.log 2>&1
lap "27B profile rc=$?"; grep -E "unprofiled|Engine.step|VerifyGraphs|_bridge_ahead|_chain_ahead|GPU busy" \
  $OUT/profile27.log; grep -A16 "^kernel / op" $OUT/profile27.log | cut -c1-120
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsE.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
