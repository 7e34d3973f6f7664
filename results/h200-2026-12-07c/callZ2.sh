#!/usr/bin/env bash
# Device call Z2 (carry .whl .fi_cache): the speculative GPU tests on the tree with the draft
# chain run ahead (e0ce0fc + its page budget a3ffe82), then issue 37's tables at 1k with the
# chain ahead: the 9B (batch 1, 4, 8; a = 0.7, 0.9) and the 27B (batch 1, 4, 8; a = 0.5, 0.7,
# 0.9). Verify attention on fa2, draft head trimmed to 32768 ids. One bench run per block.
set -uo pipefail
B=${B:-570}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 20 < want ? s - 20 : want )); }
nvidia-smi --query-gpu=name --format=csv,noheader
table() {  # name, box, args...
  local name=$1 want=$2; shift 2
  timeout $(box $want) python3 -m ninfer.bench.spec_table --device cuda --draft-vocab 32768 \
    --json $OUT/spec_table_$name.json "$@" >$OUT/spec_table_$name.log 2>&1
  lap "$name rc=$?"; grep -E "│|^row: " $OUT/spec_table_$name.log | tail -24
}
timeout $(box 130) python3 -m pytest -q -p no:cacheprovider tests/engine/test_speculative_cuda.py \
  -rA --durations=4 >$OUT/spec_tests.log 2>&1
lap "spec tests rc=$?"; grep -E "passed|failed" $OUT/spec_tests.log | tail -3
grep -E "^(FAILED|ERROR)|^E  " $OUT/spec_tests.log | head -12
table 9B_1k 150 --preset 9B --contexts 1024 --batch-sizes 1,4,8 --acceptance 0.7,0.9
table 27B_1k 270 --preset 27B --contexts 1024 --batch-sizes 1,4,8 --acceptance 0.5,0.7,0.9
mkdir -p /tmp/logs && mv $OUT/*.log /tmp/logs/ 2>/dev/null
tar czf $OUT/logsZ2.tgz -C /tmp logs; save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
