#!/usr/bin/env bash
# Device call B of the 2026-12-05 second session: cached-chat TTFT with the first (cold) turn
# (issue 39 item 3), 27B FP8 prefill and decode (issue 38), MTP decode at acceptances 0.5/0.9
# (issue 37), the 9B prefill/decode table rows on this tree (issue 36). B: seconds allowed.
set -uo pipefail
B=${B:-560}
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
cap() { local s; s=$(left); [ "$s" -gt "$1" ] && s=$1; echo "$s"; }
b() { local name=$1 c=$2; shift 2; local s; s=$(cap "$c"); [ "$s" -lt 40 ] && return 99
  timeout "$s" python3 -m ninfer bench "$@" --device cuda --json $OUT/$name.json >$OUT/$name.log 2>&1
  lap "$name rc=$?"; grep -v INFO $OUT/$name.log | tail -${TAILN:-8}; }
b ttft_9b 120 ttft --preset 9B --prompt-tokens 8192 --turns 4
b prefill_27b_fp8 110 prefill --preset 27B --quantization fp8 --prompt-tokens 8192
b decode_27b_mtp_a09 110 decode --preset 27B --speculative mtp --draft-acceptance 0.9 --prompt-tokens 1024 --batch-sizes 1,8
b bench_9b 120 prefill,decode --preset 9B --prompt-tokens 8192 --batch-sizes 1,4,8
save_caches >/dev/null 2>&1; ls $OUT | head -30
