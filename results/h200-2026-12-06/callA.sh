#!/usr/bin/env bash
# Device call A (carry .whl and .whl_srv, no JIT cache): issue 40's vision bench (9B preset and
# the released tower, a 1024x1024 image), issue 39's cached-turn TTFT (9B), issue 41's bystander
# bench, issue 39's structured-output GPU tests (jsonschema carried now); then the caches to $OUT.
set -uo pipefail
B=${B:-560}
python3 -c "import zipfile,glob; [zipfile.ZipFile(w).extractall('/tmp/site') for w in glob.glob('.whl_srv/*')]"
source tools/device/env.sh
t0=$(date +%s); lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - 20 < want ? s - 20 : want )); }
timeout $(box 130) python3 -m ninfer.bench.vision --preset 9B --device cuda --side 1024 --repeats 5 \
  >$OUT/vision_9b.json 2>$OUT/vision_9b.err
lap "vision rc=$?"; cat $OUT/vision_9b.json; grep -v INFO $OUT/vision_9b.err | tail -4
timeout $(box 200) python3 -m ninfer bench ttft --device cuda --preset 9B --prompt-tokens 8192 \
  --turns 4 --json $OUT/ttft_9b.json >$OUT/ttft_9b.log 2>&1
lap "ttft rc=$?"; grep -v INFO $OUT/ttft_9b.log | cut -c1-200 | tail -16
timeout $(box 150) python3 -m ninfer.bench.bystander --device cuda --stall-trace $OUT/stalls.json \
  >$OUT/bystander.json 2>$OUT/bystander.err
lap "bystander rc=$?"; tail -c 1800 $OUT/bystander.json; echo; grep -v INFO $OUT/bystander.err | tail -4
s=$(box 60); [ "$s" -gt 15 ] && timeout $s python3 -m pytest -q -p no:cacheprovider -o addopts="" -rsfE \
  tests/engine/test_structured_cuda.py tests/engine/test_thinking_budget_cuda.py >$OUT/structured.log 2>&1
lap "structured rc=$?: $(tail -1 $OUT/structured.log)"; grep -E "SKIP|FAIL|^E " $OUT/structured.log | head -5
save_caches >/dev/null 2>&1; ls $OUT | tr '\n' ' '; lap done
