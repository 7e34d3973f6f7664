#!/usr/bin/env bash
# Device call A of the 2026-12-05 second session: the GPU tests never run yet (state taps in bf16,
# in-pass/prompt-end engine tests, FP8 ops, MTP, structured outputs, thinking budget), a GIL
# profile of the bystander bench (issue 41), then the FP8 microbench (the engine benches are call B).
# B: seconds the whole command may take.
set -uo pipefail
B=${B:-560}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
cap() { local s; s=$(left); [ "$s" -gt "$1" ] && s=$1; echo "$s"; }
t() { local s; s=$(cap "$1"); [ "$s" -lt 20 ] && return 99
  timeout "$s" python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE --durations=3 "${@:2}"; }
show() { lap "$1 rc=$2: $(tail -1 "$3")"; grep -E "^(FAILED|ERROR)|^E  " "$3" | head -${4:-12}; }
t 90 tests/ops/test_cuda_state_taps.py -k "bf16 or off_the_chunk" >$OUT/taps.log 2>&1; show taps $? $OUT/taps.log
t 70 tests/engine/test_engine_cuda.py -k "in_pass or fork_inside or prompt_end" >$OUT/engine_cuda.log 2>&1; show engine_cuda $? $OUT/engine_cuda.log
t 90 tests/ops/test_cuda_fp8.py >$OUT/fp8.log 2>&1; show fp8 $? $OUT/fp8.log 20
t 80 tests/engine/test_speculative_cuda.py >$OUT/spec.log 2>&1; show spec $? $OUT/spec.log 20
t 70 tests/engine/test_structured_cuda.py tests/engine/test_thinking_budget_cuda.py >$OUT/struct.log 2>&1; show struct $? $OUT/struct.log
chmod +x /tmp/site/py_spy-*.data/scripts/py-spy 2>/dev/null; SPY=$(ls /tmp/site/py_spy-*.data/scripts/py-spy 2>/dev/null)
s=$(cap 75); [ "$s" -gt 30 ] && timeout "$s" "$SPY" record --gil --subprocesses --rate 250 --format raw -o $OUT/bystander_gil.txt -- \
  python3 -m ninfer.bench.bystander --device cuda --stall-trace $OUT/stalls.json >$OUT/bystander.log 2>&1
lap "bystander rc=$?"; grep -v INFO $OUT/bystander.log | tail -8; ls -la $OUT/bystander_gil.txt 2>&1
# again on the same machine: Triton and FlashInfer now find every kernel the first run compiled
s=$(cap 60); [ "$s" -gt 30 ] && timeout "$s" python3 -m ninfer.bench.bystander --device cuda \
  --stall-trace $OUT/stalls2.json >$OUT/bystander2.log 2>&1
lap "bystander (second) rc=$?"; grep -v INFO $OUT/bystander2.log | tail -8
s=$(cap 60); [ "$s" -gt 30 ] && timeout "$s" python3 tools/device/bench_fp8.py --json $OUT/bench_fp8.json >$OUT/bench_fp8.log 2>&1
lap "bench_fp8 rc=$?"; cut -c1-200 $OUT/bench_fp8.log | tail -16
save_caches >/dev/null 2>&1; ls $OUT | head -30
