#!/usr/bin/env bash
# Device call J (carry .whl .fi_cache), fifteenth session: 2026-12-07e's call G with this
# session's FP8 MoE decode change (2241da8, the activations' slice times the tile's scales where
# its rows share them). The GPU tests of the unrun FP8 MoE changes: 2241da8, the scale per whole
# scale block (7f4eeef), the FP8 grouped GEMM for the MoE's prefill-sized passes (ada63c3,
# b9593d2) and the unfused FP8 MoE block test against the prefill GEMM's arithmetic (1073232),
# in 12 processes (pytest-xdist from .whl/); then the 35B-A3B FP8 decode at batch 1 and 8 (3.9 /
# 10.5 ms a step on an H100 in 2026-12-07e's call F) with its prefill graphs, the 35B-A3B FP8
# prefill of 8k tokens, and a profile of the batch-1 decode.
set -uo pipefail
source tools/device/env.sh  # B (default 570), lap, box
nvidia-smi --query-gpu=name --format=csv,noheader
timeout $(box 200) python3 -m pytest -q $XDIST -p no:cacheprovider -o addopts="" -rfE \
  tests/ops/test_cuda_fp8.py tests/ops/test_cuda_moe.py >$OUT/tests.log 2>&1
lap "tests rc=$?: $(grep -E 'passed|failed|error' $OUT/tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/tests.log | cut -c1-300 | head -12
timeout $(box 200) python3 -m ninfer bench prefill,decode --device cuda --preset 35B-A3B \
  --quantization fp8 --no-baseline --prompt-tokens 8192 --batch-sizes 1,8 \
  --json $OUT/fp8_35b.json >$OUT/fp8_35b.log 2>&1
lap "35B fp8 rc=$?"; grep -v INFO $OUT/fp8_35b.log | grep -E "warm-up|unavailable|│|rror" | cut -c1-200 | tail -14
timeout $(box 120) python3 -m ninfer bench decode --device cuda --preset 35B-A3B \
  --quantization fp8 --no-baseline --prompt-tokens 1024 --batch-sizes 1 --profile $OUT/prof35 \
  --json $OUT/fp8_35b_prof.json >$OUT/fp8_35b_prof.log 2>&1
lap "35B fp8 profile rc=$?"; python3 -c "
import json, sys
def walk(o):
    if isinstance(o, dict):
        if 'top' in o and 'trace' in o:
            for e in o['top']: print(round(e['self_us'] / 1e3, 2), 'ms', e['calls'], e['name'][:90])
        for v in o.values(): walk(v)
    elif isinstance(o, list):
        for v in o: walk(v)
walk(json.load(open(sys.argv[1])))
" $OUT/fp8_35b_prof.json 2>&1 | head -24
rm -rf $OUT/prof35
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsJ.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
