#!/usr/bin/env bash
# Device call F3 (the machine F2 left warm): issue 37's MTP decode bench with a controlled
# draft (a = 0.7, K = 3) on the 9B preset, then the 27B, each with its stacks dumped every 40 s
# (where an eager speculative step spends its time) and TORCH_LOGS=recompiles.
set -uo pipefail
B=${B:-560}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
bench() { local name=$1 box=$2; shift 2
  TORCH_LOGS=recompiles timeout $box python3 -c "
import faulthandler, runpy, sys
faulthandler.dump_traceback_later(40, repeat=True, file=open('$OUT/${name}_stacks.txt', 'w'))
sys.argv = ['ninfer'] + sys.argv[1:]
runpy.run_module('ninfer', run_name='__main__')" "$@" --json $OUT/$name.json >$OUT/$name.log 2>&1
  lap "$name rc=$?"; grep -v INFO $OUT/$name.log | grep -v "^\s*File\|^Thread\|^Current" | cut -c1-220 | tail -22; }
bench decode_9b_mtp 240 bench decode --preset 9B --speculative mtp --draft-acceptance 0.7 \
  --prompt-tokens 1024 --batch-sizes 1,8 --device cuda
s=$(left); bench decode_27b_mtp $((s - 10)) bench decode --preset 27B --speculative mtp \
  --draft-acceptance 0.7 --prompt-tokens 1024 --batch-sizes 1 --device cuda
lap done
