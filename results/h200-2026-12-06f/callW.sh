#!/usr/bin/env bash
# Device call W (carry .whl .fi_cache): the FP8 decode GEMV with fp16 products (X16, off by
# default) against bf16 products at three 27B shapes, batch 1 and 8 (tools/device/bench_fp8.py,
# with each path's error against the float64 product), the 27B FP8 decode with X16 on, then
# the FP8 op tests of the X16 path.
set -uo pipefail
B=${B:-380}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 25 < want ? s - 25 : want )); }
timeout $(box 150) python3 tools/device/bench_fp8.py --no-prefill --rows 1,8 \
  --shapes "attn q|k|v,attn o,mlp down" --json $OUT/bench_fp8.jsonl >$OUT/bench_fp8.log 2>&1
lap "bench_fp8 rc=$?"; grep -i error $OUT/bench_fp8.log | head -3
python3 - $OUT/bench_fp8.jsonl <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "impl" in r:
        c = r.get("config") or {}
        c = {k: c[k] for k in ("BLOCK_N", "BLOCK_K", "DOT", "SPLIT_K") if k in c}
        print(f"{r['set']:>11} M={r['M']} {r['impl']:>8} {r['us']:8.2f} us of copy "
              f"{r['of_copy']:.3f} err {r.get('rel_err', '')} {c}")
    else:
        print(r)
PY
timeout $(box 170) python3 -c "
import sys, runpy
import ninfer.ops.cuda.fp8 as f
f.X16 = True
sys.argv = ['ninfer', 'bench', 'decode', '--device', 'cuda', '--preset', '27B', '--quantization',
            'fp8', '--prompt-tokens', '1024', '--batch-sizes', '1', '--no-baseline',
            '--json', '$OUT/fp8_27b_x16.json']
runpy.run_module('ninfer', run_name='__main__')" >$OUT/fp8_27b_x16.log 2>&1
lap "27B FP8 decode X16 rc=$?"; grep -E "│|rror" $OUT/fp8_27b_x16.log | grep -v "end to end" \
  | cut -c1-140 | tail -4
timeout $(box 120) python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
  tests/ops/test_cuda_fp8.py -k "fp16" >$OUT/fp8_tests.log 2>&1
lap "fp8 tests rc=$?: $(grep -E 'passed|failed|error' $OUT/fp8_tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/fp8_tests.log | cut -c1-300 | head -8
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsW.tgz -C /tmp logs; ls $OUT | tr '\n' ' '; lap done
