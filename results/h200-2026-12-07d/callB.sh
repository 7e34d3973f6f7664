#!/usr/bin/env bash
# Device call B (carry .whl .fi_cache), after call A on a warm machine: the 35B-A3B's FP8
# decode for the first time (issue 38's goal: batch 1 >= 0.5 of its bound; no bf16 baseline,
# which does not fit beside it on an 80 GB card), the routed-MoE decode kernels against the
# grouped GEMM at 16 and 32 tokens (an MTP verify pass of 4 and 8 lanes at K = 3 is 128 and
# 256 pairs, past DECODE_PAIRS = 64), then the 27B's MTP step at batch 1 kernel by kernel
# (issue 37; call Z4 of results/h200-2026-12-07c, never run).
set -uo pipefail
B=${B:-570}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 20 < want ? s - 20 : want )); }
nvidia-smi --query-gpu=name --format=csv,noheader
timeout $(box 200) python3 -m ninfer bench decode --device cuda --preset 35B-A3B \
  --quantization fp8 --no-baseline --prompt-tokens 1024 --batch-sizes 1,8 \
  --json $OUT/fp8_35b.json >$OUT/fp8_35b.log 2>&1
lap "35B fp8 rc=$?"; grep -v INFO $OUT/fp8_35b.log | grep -E "warm-up|│|rror" | cut -c1-200 | tail -10
timeout $(box 90) env PYTHONPATH=. python3 tools/device/bench_moe.py --tokens 4,8,16,32 \
  --json $OUT/bench_moe.json >$OUT/bench_moe.log 2>&1
lap "bench_moe rc=$?"; grep -E 'graph|bytes' $OUT/bench_moe.log | cut -c1-200 | head -16
timeout $(box 150) python3 tools/device/profile_spec.py --preset 27B --batch 1 --draft-vocab 32768 \
  --tokens 64 >$OUT/profile27.log 2>&1
lap "27B profile rc=$?"; grep -E "unprofiled|Engine.step|VerifyGraphs|_bridge_ahead|_chain_ahead|GPU busy" \
  $OUT/profile27.log; grep -A14 "^kernel / op" $OUT/profile27.log | cut -c1-120
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsB.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
