#!/usr/bin/env bash
# Device call D (carry .whl .fi_cache), for the next session: what call C (taken back) left
# unrun. The GPU tests of 725187c (the activation scale as torch's CUDA division computes it:
# the bit-for-bit quantisation test failed before it) and of 214dd8f (the MoE decode kernels up
# to 256 routed pairs) and 890b5d1 (the conv state taps in one launch each), the speculative
# and engine GPU tests on that tree; the 35B-A3B's MTP rows at batch
# 4 and 8 (a = 0.7; they took the grouped GEMM before 214dd8f: 0.78x / 0.85x plain in call Z3b);
# then the 35B-A3B's FP8 decode at batch 1 (4.6 ms a step in call B against bf16's 3.45) with
# the MoE block fused over its FP8 experts and shared expert (aadda42; test_cuda_fp8.py's
# `test_fp8_moe_block_with_its_shared_expert` above), its top kernels under the profiler (the
# bench's timed figures are taken apart from the profiled requests).
set -uo pipefail
source tools/device/env.sh  # B (default 570), lap, box
nvidia-smi --query-gpu=name --format=csv,noheader
timeout $(box 240) python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
  tests/ops/test_cuda_state_taps.py tests/ops/test_cuda_fp8.py tests/ops/test_cuda_moe.py \
  tests/engine/test_speculative_cuda.py tests/engine/test_engine_cuda.py \
  >$OUT/tests.log 2>&1
lap "tests rc=$?: $(grep -E 'passed|failed|error' $OUT/tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/tests.log | cut -c1-300 | head -12
timeout $(box 200) python3 -m ninfer.bench.spec_table --device cuda --draft-vocab 32768 \
  --preset 35B-A3B --kv-capacity 24576 --contexts 1024 --batch-sizes 4,8 --acceptance 0.7 \
  --json $OUT/spec_table_35B_b48.json >$OUT/spec_table_35B_b48.log 2>&1
lap "35B MTP b4/b8 rc=$?"; grep -E "^row: |note" $OUT/spec_table_35B_b48.log | cut -c1-250 | tail -6
timeout $(box 150) python3 -m ninfer bench decode --device cuda --preset 35B-A3B \
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
tar czf $OUT/logsD.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
