#!/usr/bin/env bash
# Device call C of the 2026-12-05 second session (calls A and B in one, as device time ran
# short): the GPU tests not yet run (state taps in bf16 and in-pass engine tests: issue 35; FP8
# ops: 38; MTP: 37; structured outputs and thinking budget: 39), 27B decode in FP8 and with MTP,
# then the bystander bench under py-spy (issue 41). B: seconds the whole command may take.
set -uo pipefail
B=${B:-540}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
cap() { local s; s=$(left); [ "$s" -gt "$1" ] && s=$1; echo "$s"; }
t() { local s; s=$(cap "$1"); [ "$s" -lt 20 ] && return 99
  timeout "$s" python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE --durations=3 "${@:2}"; }
show() { lap "$1 rc=$2: $(tail -1 "$3")"; grep -E "^(FAILED|ERROR)|^E  " "$3" | head -${4:-12}; }
b() { local name=$1 c=$2; shift 2; local s; s=$(cap "$c"); [ "$s" -lt 40 ] && return 99
  timeout "$s" python3 -m ninfer bench "$@" --device cuda --json $OUT/$name.json >$OUT/$name.log 2>&1
  lap "$name rc=$?"; grep -v INFO $OUT/$name.log | cut -c1-220 | tail -10; }
t 60 tests/ops/test_cuda_state_taps.py -k "bf16 or off_the_chunk" >$OUT/taps.log 2>&1; show taps $? $OUT/taps.log
t 50 tests/engine/test_engine_cuda.py -k "in_pass or fork_inside or prompt_end" >$OUT/engine_cuda.log 2>&1; show engine_cuda $? $OUT/engine_cuda.log
t 60 tests/ops/test_cuda_fp8.py >$OUT/fp8.log 2>&1; show fp8 $? $OUT/fp8.log 20
t 60 tests/engine/test_speculative_cuda.py >$OUT/spec.log 2>&1; show spec $? $OUT/spec.log 20
b decode_27b_fp8 100 decode --preset 27B --quantization fp8 --prompt-tokens 1024 --batch-sizes 1,8
b decode_27b_mtp 100 decode --preset 27B --speculative mtp --draft-acceptance 0.7 --prompt-tokens 1024 --batch-sizes 1,8
t 45 tests/engine/test_structured_cuda.py tests/engine/test_thinking_budget_cuda.py >$OUT/struct.log 2>&1; show struct $? $OUT/struct.log
chmod +x /tmp/site/py_spy-*.data/scripts/py-spy 2>/dev/null; SPY=$(ls /tmp/site/py_spy-*.data/scripts/py-spy 2>/dev/null)
s=$(cap 75); [ "$s" -gt 30 ] && timeout "$s" "$SPY" record --gil --subprocesses --rate 250 --format raw -o $OUT/bystander_gil.txt -- \
  python3 -m ninfer.bench.bystander --device cuda --stall-trace $OUT/stalls.json >$OUT/bystander.log 2>&1
lap "bystander rc=$?"; grep -v INFO $OUT/bystander.log | tail -8; ls -la $OUT/bystander_gil.txt 2>&1
save_caches >/dev/null 2>&1; ls $OUT | head -30
