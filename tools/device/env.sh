# Sourced on the device machine, in the repository root: unpacks the carried wheels (.whl/) and
# JIT caches (.fi_cache/) and sets PYTHONPATH so that `python3 -m ninfer` and pytest use them.
# Usage (the `run` tool, carry [".whl", ".fi_cache"]):  B=570 source tools/device/env.sh; ...
# `save_caches` (at the end of a command) writes the grown caches to $OUT for the next call.
# The call's time box, from the moment this is sourced: B seconds (default 570, under the
# tool's 600 s limit). `lap MSG` prints the seconds so far; `box WANT` the seconds a step may
# take: WANT, or what is left of B less BOX_MARGIN (default 20, for the logs and caches).
B=${B:-570}; BOX_MARGIN=${BOX_MARGIN:-20}; t0=$(date +%s)
lap() { echo "[$(($(date +%s) - t0)) s] $*"; }
left() { echo $((B - ($(date +%s) - t0))); }
box() { local want=$1 s; s=$(left); echo $(( s - BOX_MARGIN < want ? s - BOX_MARGIN : want )); }
if [ -z "${NINFER_DEVICE_ENV:-}" ]; then  # once per machine session (scripts source it too)
python3 -c "import zipfile,glob; [zipfile.ZipFile(w).extractall('/tmp/site') for w in glob.glob('.whl/*')]"
# unzip stamps files with the current time; older stamps keep ninja from rebuilding the carried
# FlashInfer JIT cache (it would otherwise see every header as newer than the cached objects)
find /tmp/site -exec touch -h -d 2020-01-01 {} +
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a
# keep Triton autotune results in the (carried) cache too, not only the compiled kernels
export TRITON_CACHE_AUTOTUNING=1
for f in .fi_cache/flashinfer.tgz .fi_cache/triton.tgz; do [ -f "$f" ] && tar xzf "$f" -C ~; done
# a Triton cache over the 16 MiB a call may return comes back (and is carried) in parts;
# xz parts (.txz) are a third of the gzip ones' size (the carry's 64 MiB hold both caches)
for c in triton flashinfer; do
  if compgen -G ".fi_cache/$c.tgz.part-*" >/dev/null; then cat ".fi_cache/$c.tgz.part-"* | tar xz -C ~; fi
  if compgen -G ".fi_cache/$c.txz.part-*" >/dev/null; then cat ".fi_cache/$c.txz.part-"* | tar xJ -C ~; fi
done
# torch.compile's (inductor's) cache: without it a cold machine compiles the ops' fused
# kernels again (tens of seconds of warm-up)
if compgen -G ".fi_cache/inductor.txz.part-*" >/dev/null; then
  cat .fi_cache/inductor.txz.part-* | tar xJ -C /tmp
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader
export NINFER_DEVICE_ENV=1
fi
# pytest's processes: XDIST="-n 12" where pytest-xdist came in .whl/ (here: `pip download
# pytest-xdist execnet --no-deps -d .whl`; 12 compiling processes take a cold machine's Triton
# compiles in a minute), else empty: `python3 -m pytest $XDIST ...`
XDIST=""
if python3 -c "import xdist" 2>/dev/null; then XDIST="-n 12"; fi
# Then, here: replace .fi_cache/triton.tgz* by the returned parts (the carry limit is 64 MiB
# with the wheels and the working tree: check `du -cb .whl/* .fi_cache/*` first). At most 8
# files come back from $OUT: keep the rest to one archive (the results' call scripts tar
# their logs) or a cache part is dropped, and a cold machine then compiles every Triton
# kernel of the tree again (minutes: 2026-12-06b's call G1).
save_caches() {
  if command -v xz >/dev/null; then
    tar cf - -C ~ .cache/flashinfer 2>/dev/null | xz -T0 -6 | split -b 15m - "$OUT/flashinfer.txz.part-"
    tar cf - -C ~ .triton 2>/dev/null | xz -T0 -6 | split -b 15m - "$OUT/triton.txz.part-"
    local ind="torchinductor_$(id -un)"
    [ -d "/tmp/$ind" ] && tar cf - -C /tmp "$ind" | xz -T0 -6 | split -b 15m - "$OUT/inductor.txz.part-"
  else
    tar czf - -C ~ .cache/flashinfer 2>/dev/null | split -b 15m - "$OUT/flashinfer.tgz.part-"
    tar czf - -C ~ .triton 2>/dev/null | split -b 15m - "$OUT/triton.tgz.part-"
  fi
  ls -la "$OUT"/*.t?z*
}
