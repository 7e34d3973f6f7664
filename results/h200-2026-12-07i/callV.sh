#!/usr/bin/env bash
# Device call V (carry .whl, and .fi_cache on a cold machine): where the 27B FP8 decode's time
# goes beyond its GEMVs. Issue 38 asks 0.85 of the FP8 bound at batch 1; the H100 read 0.72
# (12.69 ms against 9.09), and the GEMVs alone read 0.63-0.86 of the copy rate. One decode
# bench at batch 1 with `--profile` (the bench's figure, then 8 profiled steps), then the
# trace's kernels summed by name (`kernel_sums.py`) and its idle gaps (`trace_gaps.py`).
set -uo pipefail
source tools/device/env.sh  # B (default 570), lap, box
nvidia-smi --query-gpu=name --format=csv,noheader
timeout $(box 300) python3 -m ninfer bench decode --device cuda --preset 27B \
  --quantization fp8 --no-baseline --prompt-tokens 1024 --batch-sizes 1 --profile /tmp/prof27 \
  --json $OUT/fp8_27b_prof.json >$OUT/fp8_27b_prof.log 2>&1
lap "27B fp8 profile rc=$?"; grep -v INFO $OUT/fp8_27b_prof.log | grep -E "│|rror" | cut -c1-200 | tail -6
python3 results/h200-2026-12-07i/kernel_sums.py /tmp/prof27/decode.json --top 30 \
  >$OUT/kernels27.txt 2>&1; head -40 $OUT/kernels27.txt
python3 tools/device/trace_gaps.py /tmp/prof27/decode.json --top 8 --json $OUT/gaps27.json \
  >/dev/null 2>&1; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: v for k, v in d.items() if not isinstance(v, list)})" $OUT/gaps27.json 2>&1 | cut -c1-600
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsV.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
