#!/usr/bin/env bash
# Device call Z4 (carry .whl .fi_cache), for the next session: where the 27B's MTP step goes
# (batch 1, a = 0.7: 24.7 ms a verify step against plain decode's 19.0 on an H100, call Z2),
# the 9B step with the draft chain ahead of the read and after it on one machine (the A/B that
# calls Y3 and Z1 never ran), then the 27B 32k rows at batch 8 with a run long enough for a
# window (call Z3a had none at 64 decode tokens). Before those: the routed-MoE decode kernels
# against the grouped GEMM at 16 and 32 tokens (an MTP verify pass of 4 and 8 lanes at K = 3:
# 128 and 256 pairs, past DECODE_PAIRS = 64, so the 35B-A3B's verify takes the grouped GEMM
# there, and MTP ran slower than plain decode at batch 4 and 8 in call Z3b). FP8 (issue 38): `callM2.sh` of
# results/h200-2026-12-06e as it stands.
set -uo pipefail
B=${B:-560}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 20 < want ? s - 20 : want )); }
nvidia-smi --query-gpu=name --format=csv,noheader
timeout $(box 150) python3 tools/device/profile_spec.py --preset 27B --batch 1 --draft-vocab 32768 \
  --tokens 64 >$OUT/profile27.log 2>&1
lap "27B profile rc=$?"; grep -E "unprofiled|Engine.step|VerifyGraphs|_bridge_ahead|_chain_ahead|GPU busy" \
  $OUT/profile27.log; grep -A14 "^kernel / op" $OUT/profile27.log | cut -c1-120
timeout $(box 90) env PYTHONPATH=. python3 tools/device/bench_moe.py --tokens 4,8,16,32 \
  --json $OUT/bench_moe.json >$OUT/bench_moe.log 2>&1
lap "bench_moe rc=$?"; grep -E 'graph|bytes' $OUT/bench_moe.log | cut -c1-200 | head -16
for mode in ahead after; do
  flag=""; [ $mode = after ] && flag="--no-ahead"
  timeout $(box 60) python3 tools/device/profile_spec.py --preset 9B --batch 1 --draft-vocab 32768 \
    --tokens 96 --no-profile $flag >$OUT/profile9_$mode.log 2>&1
  lap "9B b1 $mode rc=$?"; grep -E "unprofiled|Engine.step|VerifyGraphs|Stepper.settle" $OUT/profile9_$mode.log
done
timeout $(box 240) python3 -m ninfer.bench.spec_table --device cuda --draft-vocab 32768 --preset 27B \
  --contexts 32768 --batch-sizes 8 --acceptance 0.7 --decode-tokens 256 \
  --json $OUT/spec_table_27B_32k_b8.json >$OUT/spec_table_27B_32k_b8.log 2>&1
lap "27B 32k b8 rc=$?"; grep -E "^row: |note" $OUT/spec_table_27B_32k_b8.log | tail -4
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsZ4.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
