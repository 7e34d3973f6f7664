#!/usr/bin/env bash
# Device call D of the 2026-12-05 second session: call C again with FlashInfer's experimental
# package restored (call C's wheel lacked it, so CudaOps did not load and every GPU test
# skipped). MTP decode runs on the 27B on an H200, on the 9B where the card has 80 GB.
set -uo pipefail
B=${B:-470}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
cap() { local s; s=$(left); [ "$s" -gt "$1" ] && s=$1; echo "$s"; }
t() { local s; s=$(cap "$1"); [ "$s" -lt 20 ] && return 99
  timeout "$s" python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE --durations=3 "${@:2}"; }
show() { lap "$1 rc=$2: $(tail -1 "$3")"; grep -E "^(FAILED|ERROR)|^E  " "$3" | cut -c1-200 | head -${4:-10}; }
b() { local name=$1 c=$2; shift 2; local s; s=$(cap "$c"); [ "$s" -lt 40 ] && return 99
  timeout "$s" python3 -m ninfer bench "$@" --device cuda --json $OUT/$name.json >$OUT/$name.log 2>&1
  lap "$name rc=$?"; grep -v INFO $OUT/$name.log | cut -c1-220 | tail -10; }
python3 -c "import flashinfer, ninfer.ops.cuda" 2>&1 | tail -2
t 60 tests/ops/test_cuda_fp8.py -x >$OUT/fp8.log 2>&1; show fp8 $? $OUT/fp8.log 16
t 60 tests/engine/test_speculative_cuda.py >$OUT/spec.log 2>&1; show spec $? $OUT/spec.log 16
t 50 tests/ops/test_cuda_state_taps.py -k "bf16 or off_the_chunk" >$OUT/taps.log 2>&1; show taps $? $OUT/taps.log
t 50 tests/engine/test_engine_cuda.py -k "in_pass or fork_inside or prompt_end" >$OUT/engine_cuda.log 2>&1; show engine_cuda $? $OUT/engine_cuda.log
t 45 tests/engine/test_structured_cuda.py tests/engine/test_thinking_budget_cuda.py >$OUT/struct.log 2>&1; show struct $? $OUT/struct.log
b decode_27b_fp8 100 decode --preset 27B --quantization fp8 --prompt-tokens 1024 --batch-sizes 1,8
M=9B; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && M=27B
b decode_${M}_mtp 90 decode --preset $M --speculative mtp --draft-acceptance 0.7 --prompt-tokens 1024 --batch-sizes 1,8
chmod +x /tmp/site/py_spy-*.data/scripts/py-spy 2>/dev/null; SPY=$(ls /tmp/site/py_spy-*.data/scripts/py-spy 2>/dev/null)
s=$(left); [ "$s" -gt 40 ] && timeout -s INT "$((s - 8))" "$SPY" record --gil --subprocesses --rate 200 --format raw -o $OUT/bystander_gil.txt -- \
  python3 -m ninfer.bench.bystander --device cuda --stall-trace $OUT/stalls.json >$OUT/bystander.log 2>&1
lap "bystander rc=$?"; grep -v INFO $OUT/bystander.log | tail -6; ls -la $OUT/bystander_gil.txt 2>&1
