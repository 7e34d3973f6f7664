#!/usr/bin/env bash
# Device call 3 of 2026-12-03: the cold 8k prefill of the 9B preset, A/B: the tree before the
# PROMPT_END snapshots (3accbb4, copied to ab_base/ for this call) and HEAD, alternating.
set -uo pipefail
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
for i in 1 2; do
  for tree in head base; do
    root=$PWD; [ $tree = base ] && root=$PWD/ab_base
    PYTHONPATH=/tmp/site:$root timeout 200 python3 -m ninfer bench prefill --device cuda --preset 9B \
      --prompt-tokens 8192 --json $OUT/prefill_${tree}_$i.json >/tmp/p_${tree}_$i.log 2>&1
    lap "$tree $i rc=$?: $(grep -E '^│ 8192' /tmp/p_${tree}_$i.log)"
  done
done
