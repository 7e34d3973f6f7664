#!/usr/bin/env bash
# Device call U (after T, on its warm machine, or carry .whl .fi_cache): the FP8 decode GEMV
# with fp16 products (X16, off by default) against bf16 products: the FP8 op tests with both,
# tools/device/bench_fp8.py's decode shapes, then the 27B FP8 decode bench with X16 on and off.
set -uo pipefail
B=${B:-580}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 40 < want ? s - 40 : want )); }
timeout $(box 170) python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
  tests/ops/test_cuda_fp8.py -k "skinny or fp16 or decode" >$OUT/fp8_tests.log 2>&1
lap "fp8 tests rc=$?: $(grep -E 'passed|failed|error' $OUT/fp8_tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/fp8_tests.log | cut -c1-300 | head -12
timeout $(box 180) python3 tools/device/bench_fp8.py --no-prefill --json $OUT/bench_fp8.jsonl \
  >$OUT/bench_fp8.log 2>&1
lap "bench_fp8 rc=$?"
python3 - $OUT/bench_fp8.jsonl <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "impl" in r:
        print(f"{r['set']:>12} M={r['M']} {r['impl']:>8} {r['us']:8.2f} us  of copy {r['of_copy']}"
              f"  {r.get('config') or ''}")
    else:
        print(r)
PY
for x16 in True False; do
  timeout $(box 150) python3 -c "
import sys, runpy
import ninfer.ops.cuda.fp8 as f
f.X16 = $x16
sys.argv = ['ninfer', 'bench', 'decode', '--device', 'cuda', '--preset', '27B', '--quantization',
            'fp8', '--prompt-tokens', '1024', '--batch-sizes', '1,8', '--no-baseline',
            '--json', '$OUT/fp8_27b_x16_$x16.json']
runpy.run_module('ninfer', run_name='__main__')" >$OUT/fp8_27b_x16_$x16.log 2>&1
  lap "27B FP8 decode X16=$x16 rc=$?"; grep -v INFO $OUT/fp8_27b_x16_$x16.log | grep -E "│|rror" \
    | grep -v "end to end" | cut -c1-140 | tail -5
done
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsU.tgz -C /tmp logs; ls $OUT | tr '\n' ' '; lap done
