#!/usr/bin/env bash
# Runs on the device machine (the `run` tool, carry [".mwhl"]: mutmut and its dependencies as
# cp312 wheels): tools/mutation.sh for GROUP (default cache) on JOBS CPU workers (default 14; no
# GPU), stopped by SIGINT after BOX_S seconds and killed after KILL_S, so that the report
# (report.txt, report.md) and the run's mutants and verdicts (GROUP-mutants.tgz) reach $OUT
# inside the tool's 600 s. The image's python3 is called through a wrapper script (a symlink
# would lose its environment).
#   [GROUP=engine] [JOBS=14] [BOX_S=400] [KILL_S=470] bash tools/device/mutation.sh
mkdir -p /tmp/mbin /tmp/msite
pip install -q --no-deps --target /tmp/msite .mwhl/*.whl > $OUT/pip.log 2>&1
printf '#!/bin/sh\nexec python3 "$@"\n' > /tmp/mbin/python
printf '#!/bin/sh\nexec /tmp/mbin/python -m mutmut "$@"\n' > /tmp/mbin/mutmut
chmod +x /tmp/mbin/python /tmp/mbin/mutmut
export PYTHONPATH=/tmp/msite CUDA_VISIBLE_DEVICES=""
nproc; start=$(date +%s)
timeout -s KILL ${KILL_S:-470} env PYTHON=/tmp/mbin/python bash tools/mutation.sh -g ${GROUP:-cache} -j ${JOBS:-14} -t ${BOX_S:-400} > $OUT/run.log 2>&1
echo "run rc=$? after $(($(date +%s) - start)) s"
pkill -9 -f mutmut; sleep 1
PYTHON=/tmp/mbin/python bash tools/mutation.sh -g ${GROUP:-cache} -r > $OUT/report.txt 2>&1
PYTHON=/tmp/mbin/python bash tools/mutation.sh -g ${GROUP:-cache} -r -m > $OUT/report.md 2>&1
tar czf $OUT/${GROUP:-cache}-mutants.tgz --exclude='*.pyc' --exclude=__pycache__ -C .mutation/${GROUP:-cache} mutants
ls -la $OUT; tail -5 $OUT/run.log; head -40 $OUT/report.txt
