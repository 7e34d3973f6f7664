#!/usr/bin/env bash
# Device call T (carry .whl; cold caches): the speculative GPU tests on the tree whose sampled
# lanes draft and accept on the device (63c96e4, cb0e634), whose conv taps gather through one
# index a pass (d23ac51) and whose reads share `runner.read_later` (5e2400e): none of these
# had run on a GPU. Then the verify step's attention three ways
# (tools/device/bench_verify_attention.py), then issue 37's table for one model with the
# trimmed draft head, the controlled acceptance now a Weyl sequence.
# MODEL=9B (default) | 27B | 35B-A3B; CONTEXTS=1024 (default) or 32768.
set -uo pipefail
B=${B:-580}; MODEL=${MODEL:-9B}; CONTEXTS=${CONTEXTS:-1024}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 40 < want ? s - 40 : want )); }
timeout $(box 230) python3 -m pytest -q -p no:cacheprovider -o addopts="" -rfE \
  tests/engine/test_speculative_cuda.py tests/test_sampling_speculative.py >$OUT/spec_tests.log 2>&1
lap "spec tests rc=$?: $(grep -E 'passed|failed|error' $OUT/spec_tests.log | tail -1)"
grep -E "^(FAILED|ERROR)|^E  " $OUT/spec_tests.log | cut -c1-300 | head -12
timeout $(box 120) python3 tools/device/bench_verify_attention.py --models 9B,27B \
  --batches 1,8 --contexts 1024,32768 --json $OUT/verify_attention.json >$OUT/verify_attn.log 2>&1
lap "verify attention rc=$?"; grep -v -E "INFO|Warn" $OUT/verify_attn.log | tail -12
timeout $(box 400) python3 -m ninfer.bench.spec_table --device cuda \
  --preset "$MODEL" --contexts "$CONTEXTS" --batch-sizes 1,4,8 --acceptance 0.5,0.7,0.9 \
  --draft-vocab 32768 --json $OUT/spec_table_$MODEL.json >$OUT/spec_table_$MODEL.log 2>&1
lap "spec_table rc=$?"; grep -v INFO $OUT/spec_table_$MODEL.log | tail -30
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logs.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
