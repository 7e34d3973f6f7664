#!/usr/bin/env bash
# Device call (issue 35 item 3: rungs inside a single long pass, branch hG2). Under 6 minutes:
#   1. the GPU tests of the state taps (ops: fla's chunk states h and the conv inputs against
#      passes split at the taps; engine: the in-pass rungs, the tail tap, a fork resuming at a
#      rung of one long pass)
#   2. `bench reuse` subagents (must reach >= 0.95; 0.920 before) and noreply on the 9B preset
#   3. the cold 8k prefill of the 9B preset, A/B against the tree before the change (must stay
#      within 2 %): copy main at hG2's base to ab_base/ first, e.g.
#        mkdir ab_base && git archive f34b8db ninfer | tar x -C ab_base
#      (without ab_base/ only HEAD is timed).
# Carry [".whl", ".fi_cache", "ab_base"].
set -uo pipefail
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((345 - ($(date +%s) - t0))); }  # seconds left of the call's budget
timeout 110 python3 -m pytest -q -p no:cacheprovider tests/ops/test_cuda_state_taps.py \
  tests/engine/test_engine_cuda.py -k "state_taps or taps_match or off_the_chunk or in_pass or \
fork_inside or prompt_end" >$OUT/tests.log 2>&1
lap "tests rc=$?"; tail -5 $OUT/tests.log
timeout 120 python3 results/h200-2026-12-03/reuse_traces.py 9B cuda 1 subagents,noreply \
  >$OUT/reuse_9b.log 2>&1
lap "reuse rc=$?"; grep -v "INFO\|^{" $OUT/reuse_9b.log | tail -4
for i in 1 2; do
  for tree in head base; do
    root=$PWD; [ $tree = base ] && root=$PWD/ab_base
    [ -d "$root/ninfer" ] || continue
    t=$(left); [ "$t" -gt 45 ] || break 2; [ "$t" -gt 90 ] && t=90
    PYTHONPATH=/tmp/site:$root timeout $t python3 -m ninfer bench prefill --device cuda \
      --preset 9B --prompt-tokens 8192 --json $OUT/prefill_${tree}_$i.json >/tmp/p_${tree}_$i.log 2>&1
    lap "$tree $i rc=$?: $(grep -E '^│ 8192' /tmp/p_${tree}_$i.log)"
  done
done
