#!/usr/bin/env bash
# Device call U (carry .whl, and .fi_cache on a cold machine), after call T: what the host
# acceptance of rows with a grammar or logprobs (c628d16: drafts read before the pass, no
# bridge queued behind it) costs against the free rows' pipeline. The 9B at a = 0.7, K = 3,
# batch 1 and 8, 1k context: every lane free, then every lane asking for one logprob
# (`--logprobs 1`, the same host path as a grammar's), plain decode in each run.
set -uo pipefail
source tools/device/env.sh  # B (default 570), lap, box
nvidia-smi --query-gpu=name --format=csv,noheader
for lp in none 1; do
  extra=""; [ "$lp" != none ] && extra="--logprobs $lp"
  timeout $(box 260) python3 -m ninfer.bench.spec_table --device cuda --draft-vocab 32768 \
    --preset 9B --kv-capacity 24576 --contexts 1024 --batch-sizes 1,8 --acceptance 0.7 \
    $extra --json $OUT/spec_9B_lp$lp.json >$OUT/spec_9B_lp$lp.log 2>&1
  lap "9B logprobs=$lp rc=$?"; grep -E "^row: " $OUT/spec_9B_lp$lp.log | cut -c1-200 | tail -4
done
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsU.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
