#!/usr/bin/env bash
# Device call K (carry .whl .fi_cache), fifteenth session: 2026-12-07e's call H, unchanged:
# issue 37's rows with the MTP layer in FP8 (7d3c19b, `--draft-quantization fp8`: the layer in
# half its bytes, a 27B draft pass about 0.8 GB instead of 1.2; the 27B's three head passes
# took 0.50 ms each of a 23.6 ms step in 2026-12-07d's call B) beside the bf16 head in the
# same run (calls F5-F6 of 2026-12-07e: 27B 8.93 ms a token, 9B 3.26, 35B-A3B 2.86 at batch
# 1, a = 0.7), then the speculative GPU tests on that tree.
set -uo pipefail
source tools/device/env.sh  # B (default 570), lap, box
nvidia-smi --query-gpu=name --format=csv,noheader
for p in 27B 9B 35B-A3B; do
  for q in none fp8; do
    extra=(); [ $q = fp8 ] && extra=(--draft-quantization fp8)
    timeout $(box 150) python3 -m ninfer.bench.spec_table --device cuda --draft-vocab 32768 \
      --preset $p --kv-capacity 24576 --contexts 1024 --batch-sizes 1 --acceptance 0.7 \
      "${extra[@]}" --json $OUT/spec_${p}_${q}.json >$OUT/spec_${p}_${q}.log 2>&1
    lap "$p draft $q rc=$?"; grep -E "^row: " $OUT/spec_${p}_${q}.log | cut -c1-200 | tail -2
  done
done
timeout $(box 150) python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
  tests/engine/test_speculative_cuda.py >$OUT/tests.log 2>&1
lap "tests rc=$?: $(grep -E 'passed|failed|error' $OUT/tests.log | tail -1)"
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsK.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
