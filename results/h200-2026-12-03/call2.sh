#!/usr/bin/env bash
# Device call 2 of 2026-12-03: the cold 8k prefill of the 9B preset (issue 35: within 2 % of
# 199.5 ms), then the noreply trace of `bench reuse` at scale 4 (8192-token start) on the 9B
# preset (issue 35: >= 0.99 of theoretical), then the other traces at scale 1 if time is left.
set -uo pipefail
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
timeout 260 python3 -m ninfer bench prefill --device cuda --preset 9B --prompt-tokens 8192 \
  --json $OUT/prefill_9b.json >$OUT/prefill_9b.log 2>&1
lap "prefill rc=$?"; grep -v "INFO" $OUT/prefill_9b.log | tail -8
timeout 220 python3 results/h200-2026-12-03/reuse_traces.py 9B cuda 4 noreply >$OUT/reuse_noreply_9b.log 2>&1
lap "reuse noreply rc=$?"; grep -v "INFO\|^{" $OUT/reuse_noreply_9b.log | tail -6
left=$((570 - ($(date +%s) - t0)))
[ "$left" -gt 60 ] && timeout $left python3 results/h200-2026-12-03/reuse_traces.py 9B cuda 1 \
  agent,subagents,chat,edit,retry >$OUT/reuse_others_9b.log 2>&1
lap "reuse others rc=$?"; grep -v "INFO\|^{" $OUT/reuse_others_9b.log | tail -8
