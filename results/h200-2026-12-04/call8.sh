#!/usr/bin/env bash
# Device call 8 (issue 35 item 3), run on the tree of branch hG2 (354653c: in-pass state taps on
# main's structure) with the command below inline; the device time left allowed no A/B prefill.
source tools/device/env.sh >/dev/null 2>&1; t0=$(date +%s)
timeout 170 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
  tests/ops/test_cuda_state_taps.py tests/engine/test_engine_cuda.py \
  -k "state_taps or taps_match or off_the_chunk or in_pass or fork_inside or prompt_end" >$OUT/hg.log 2>&1
echo "[$(($(date +%s)-t0)) s] tests"; tail -15 $OUT/hg.log
timeout 120 python3 results/h200-2026-12-03/reuse_traces.py 9B cuda 1 subagents,noreply >$OUT/reuse.log 2>&1
echo "[$(($(date +%s)-t0)) s] reuse"; grep -v "INFO\|^{" $OUT/reuse.log | tail -6
