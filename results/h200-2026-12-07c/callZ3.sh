#!/usr/bin/env bash
# Device calls Z3a-Z3d (carry .whl .fi_cache; run one after another on the machine call Z2
# left warm, tree 5616d21), as typed into the run tool; outputs in callZ3/.
source tools/device/env.sh
case ${1:-a} in
a)  # the 35B-A3B at 1k (its MTP engine found no memory for 'auto' KV: callZ3/*_auto_kv_oom.log),
    # then the 27B at 32k (batch 8 without an all-decoding window at 64 decode tokens)
    B=480; t0=$(date +%s)
    for spec in "35B_1k --preset 35B-A3B --contexts 1024 --batch-sizes 1,4,8 --acceptance 0.5,0.7,0.9" \
                "27B_32k --preset 27B --contexts 32768 --batch-sizes 1,8 --acceptance 0.7"; do
      set -- $spec; name=$1; shift; left=$((B - ($(date +%s) - t0) - 20)); [ $left -lt 60 ] && break
      timeout $left python3 -m ninfer.bench.spec_table --device cuda --draft-vocab 32768 \
        --json $OUT/spec_table_$name.json "$@" > $OUT/spec_table_$name.log 2>&1
      echo "[$(($(date +%s)-t0)) s] $name rc=$?"; grep -E "^row: " $OUT/spec_table_$name.log
    done ;;
b)  # the 35B-A3B at 1k with KV sized
    timeout 250 python3 -m ninfer.bench.spec_table --device cuda --draft-vocab 32768 --kv-capacity 24576 \
      --json $OUT/spec_table_35B_1k.json --preset 35B-A3B --contexts 1024 --batch-sizes 1,4,8 \
      --acceptance 0.7,0.9 > $OUT/spec_table_35B_1k.log 2>&1 ;;
c)  # the 35B-A3B batch-1 step, phase by phase and kernel by kernel
    timeout 200 python3 tools/device/profile_spec.py --preset 35B-A3B --batch 1 --draft-vocab 32768 \
      --tokens 64 > $OUT/profile35.log 2>&1 ;;
d)  # the 35B-A3B with 2 and 1 drafts a step
    for k in 2 1; do
      timeout 100 python3 -m ninfer.bench.spec_table --device cuda --draft-vocab 32768 --kv-capacity 24576 \
        --draft-tokens $k --json $OUT/spec_table_35B_1k_k$k.json --preset 35B-A3B --contexts 1024 \
        --batch-sizes 1,8 --acceptance 0.7,0.9 > $OUT/spec_table_35B_1k_k$k.log 2>&1
    done ;;
esac
