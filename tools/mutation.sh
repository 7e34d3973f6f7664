#!/usr/bin/env bash
# Mutation testing of the cache and of the engine's cache decisions (docs/mutation.md).
#
#   tools/mutation.sh [-g GROUP] [-j CHILDREN] [-t SECONDS] [-k] [-s] [-a TESTS] [-r] [-m] [MODULE ...]
#
#   -g GROUP     a group of [tool.ninfer-mutation.groups] in pyproject.toml: cache (default) or
#                engine; the group names the modules to mutate and the tests that may kill them
#   -j CHILDREN  mutmut worker processes (default 1; the run is niced to 19)
#   -t SECONDS   stop the run after this long (default: no limit); what ran is still reported
#   -k           keep the previous run's mutants and results: go on with the mutants not run yet
#   -s           keep them and run the previous run's survivors again (after adding tests)
#   -a TESTS     keep the previous run and run each of its survivors against these test files
#                (space-separated; files added since the run, which mutmut's own -s cannot select
#                once the run's configuration is fixed): a mutant they fail is recorded killed
#   -r           report only: print the table of the last run, run nothing
#   -m           print the table as Markdown (for docs/mutation.md)
#   MODULE       files to mutate, e.g. ninfer/cache/host_tier.py (default: every module of the group)
#
# Each group runs in a scratch copy of the tree (.mutation/GROUP, or $NINFER_MUTATION_DIR/GROUP)
# whose pyproject.toml has the group's overrides written over [tool.mutmut], so the working tree
# is never touched. Hypothesis runs under the deterministic "mutation" profile (tests/conftest.py).
# The score per module is (killed + timed out) / (mutants - listed equivalents); the equivalent
# mutants, each with its reason and the line it writes, are listed in
# tests/cache/equivalent_mutants.toml and only count when that line is still what the mutant
# writes.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
GROUP=cache
CHILDREN=1
TIMEBOX=0
KEEP=0
REPORT_ONLY=0
MARKDOWN=0
SURVIVORS=0
ADDED=""
while getopts "g:j:t:krsma:" opt; do
    case $opt in
        g) GROUP=$OPTARG ;;
        j) CHILDREN=$OPTARG ;;
        t) TIMEBOX=$OPTARG ;;
        k) KEEP=1 ;;
        s) KEEP=1; SURVIVORS=1 ;;
        a) ADDED=$OPTARG ;;
        r) REPORT_ONLY=1 ;;
        m) MARKDOWN=1 ;;
        *) sed -n '2,23p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))

PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
MUTMUT=$(dirname "$PYTHON")/mutmut
WORK=${NINFER_MUTATION_DIR:-$ROOT/.mutation}/$GROUP
EQUIVALENTS=$ROOT/tests/cache/equivalent_mutants.toml

# The group's modules: the named ones, or every file its only_mutate patterns match.
mapfile -t MODULES < <("$PYTHON" - "$ROOT" "$GROUP" "$@" <<'PY'
import glob, sys, tomllib
root, group, named = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(f"{root}/pyproject.toml", "rb") as f:
    groups = tomllib.load(f)["tool"]["ninfer-mutation"]["groups"]
if group not in groups:
    sys.exit(f"unknown group {group!r}; pyproject.toml has {sorted(groups)}")
if named:
    print("\n".join(named))
else:
    found = set()
    for pattern in groups[group]["only_mutate"]:
        found.update(p[len(root) + 1:] for p in glob.glob(f"{root}/{pattern}") if p.endswith(".py"))
    print("\n".join(sorted(found)))
PY
)

if [[ -n $ADDED ]]; then
    # Survivors of the kept run against the added test files, one mutant at a time in the run's
    # mutants directory (mutmut's trampolines pick the mutant from MUTANT_UNDER_TEST); a failing
    # test (pytest exit 1) records the mutant killed in its .meta, anything else leaves it.
    read -ra TESTS <<<"$ADDED"
    for t in "${TESTS[@]}"; do
        mkdir -p "$WORK/mutants/$(dirname "$t")" && cp "$ROOT/$t" "$WORK/mutants/$t"
    done
    (cd "$WORK/mutants" && OMP_NUM_THREADS=1 NINFER_HYPOTHESIS_PROFILE=mutation \
        nice -n 19 "$PYTHON" - "${#MODULES[@]}" "${MODULES[@]}" "${TESTS[@]}" <<'PY'
import json, os, subprocess, sys
from pathlib import Path
from mutmut.stats import status_by_exit_code
n = int(sys.argv[1])
modules, tests = sys.argv[2:2 + n], sys.argv[2 + n:]
cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
clean = subprocess.run(cmd, env=dict(os.environ, MUTANT_UNDER_TEST="none"), capture_output=True)
if clean.returncode != 0:  # a failure there would "kill" every mutant
    sys.exit("the added tests fail on the unmutated code:\n" + clean.stdout.decode()[-2000:])
for module in modules:
    meta = Path(module + ".meta")
    if not meta.exists():
        continue
    data = json.loads(meta.read_text())
    codes = data["exit_code_by_key"]
    again = [k for k, c in codes.items() if status_by_exit_code[c] in ("survived", "no tests")]
    killed = 0
    for name in again:
        env = dict(os.environ, MUTANT_UNDER_TEST=name)
        try:
            rc = subprocess.run(cmd, env=env, capture_output=True, timeout=600).returncode
        except subprocess.TimeoutExpired:
            rc = None
        if rc == 1:
            codes[name] = 1
            killed += 1
    meta.write_text(json.dumps(data, indent=4))
    print(f"{module}: {killed} of {len(again)} survivors killed by the added tests")
PY
    )
    REPORT_ONLY=1
fi

if [[ $REPORT_ONLY == 0 ]]; then
    if [[ $KEEP == 0 ]]; then
        rm -rf "$WORK"
    fi
    mkdir -p "$WORK"
    rm -rf "$WORK/ninfer" "$WORK/tests"
    # A snapshot of the sources and tests as they are now (uncommitted edits included).
    (cd "$ROOT" && tar -cf - --exclude=__pycache__ --exclude=.hypothesis ninfer tests) \
        | (cd "$WORK" && tar -xf -)
    # A kept run keeps its configuration: a changed one would make mutmut forget its results.
    [[ $KEEP == 1 && -f "$WORK/pyproject.toml" ]] || "$PYTHON" - "$ROOT/pyproject.toml" \
        "$WORK/pyproject.toml" "$GROUP" "${MODULES[@]}" <<'PY'
import json, re, sys, tomllib
src, dst, group, *modules = sys.argv[1:]
text = open(src).read()
conf = tomllib.loads(text)["tool"]
table = dict(conf["mutmut"], **conf["ninfer-mutation"]["groups"][group])
table["only_mutate"] = modules  # mutate only the modules of this run
# Drop [tool.mutmut] and write the group's table in its place (JSON scalars and string lists
# are valid TOML).
text = re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[)", "", text)
lines = ["[tool.mutmut]"] + [f"{k} = {json.dumps(v)}" for k, v in table.items()]
open(dst, "w").write(text + "\n" + "\n".join(lines) + "\n")
PY
    # mutmut needs the selected tests to pass on the unmutated copy. A test that fails there
    # (another change in progress) is deselected for this run and named in the output; the
    # deselection goes through PYTEST_ADDOPTS, which mutmut does not fingerprint, so a later
    # -k or -s run keeps the results.
    (cd "$WORK" && NINFER_HYPOTHESIS_PROFILE=mutation nice -n 19 "$PYTHON" - <<'PY'
import re, shlex, subprocess, sys, tomllib
conf = tomllib.load(open("pyproject.toml", "rb"))["tool"]["mutmut"]
sel = conf["pytest_add_cli_args_test_selection"]
out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", *sel],
                     capture_output=True, text=True).stdout
failed = sorted(set(re.findall(r"^FAILED (\S+)", out, re.M)))
if failed:
    print("deselected, failing on the unmutated tree:\n  " + "\n  ".join(failed))
open("deselect.txt", "w").write(" ".join(f"--deselect {shlex.quote(f)}" for f in failed))
PY
    )
    export PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} $(cat "$WORK/deselect.txt")"
    LIMIT=()
    if [[ $TIMEBOX != 0 ]]; then
        LIMIT=(timeout --signal=INT "$TIMEBOX")
    fi
    NAMES=()
    if [[ $SURVIVORS == 1 ]]; then
        # mutmut runs mutants named on its command line again, with any new tests
        mapfile -t NAMES < <(cd "$WORK" && "$PYTHON" - "${MODULES[@]}" <<'PY'
import json, sys
from pathlib import Path
from mutmut.stats import status_by_exit_code
for module in sys.argv[1:]:
    meta = Path("mutants") / (module + ".meta")
    if meta.exists():
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if status_by_exit_code[code] in ("survived", "no tests", "suspicious"):
                print(name)
PY
        )
        if [[ ${#NAMES[@]} == 0 ]]; then
            echo "no survivors to run again"
            LIMIT=(true)
        fi
    fi
    echo "mutation run: group $GROUP, ${#MODULES[@]} modules, $CHILDREN worker(s), in $WORK"
    # mutmut forks a worker per mutant: torch's OpenMP pool does not survive a fork (the
    # worker blocks at its first parallel op), so the engine tests run single-threaded.
    export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
    (cd "$WORK" && NINFER_HYPOTHESIS_PROFILE=mutation NINFER_MUTATION_TEST_WALL_S=180 \
        nice -n 19 "${LIMIT[@]}" \
        "$MUTMUT" run --max-children "$CHILDREN" "${NAMES[@]}" | tail -n 5) || true
fi

cd "$WORK"
NINFER_MUTATION_MARKDOWN=$MARKDOWN "$PYTHON" - "$EQUIVALENTS" "${MODULES[@]}" <<'PY'
import json, os, sys, tomllib
from pathlib import Path

from mutmut.mutation.diff_apply import get_diff_for_mutant
from mutmut.stats import status_by_exit_code

equivalents_file, modules = sys.argv[1], sys.argv[2:]
listed = tomllib.loads(Path(equivalents_file).read_text()) if Path(equivalents_file).exists() else {}
markdown = os.environ.get("NINFER_MUTATION_MARKDOWN") == "1"

columns = ("module", "mutants", "killed", "timed out", "survived", "equivalent", "score")
rows, survivors, stale = [], [], []
for module in modules:
    meta = Path("mutants") / (module + ".meta")
    codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
    status = {name: status_by_exit_code[code] for name, code in codes.items()}
    equivalent = set()
    for entry in listed.get(module, []):
        name = entry["mutant"]
        if name not in status:
            stale.append(f"{module}: {name} (no such mutant)")
            continue
        diff = get_diff_for_mutant(name, path=module)
        added = [line[1:].strip() for line in diff.splitlines() if line.startswith("+ ")
                 or (line.startswith("+") and not line.startswith("+++"))]
        if entry["line"].strip() not in added:
            stale.append(f"{module}: {name} now writes {added!r}, listed as {entry['line']!r}")
            continue
        equivalent.add(name)
    killed = sum(s == "killed" for s in status.values())
    timed_out = sum(s == "timeout" for s in status.values())
    counted = len(status) - len(equivalent)
    survived = [n for n, s in status.items() if s not in ("killed", "timeout") and n not in equivalent]
    unchecked = sum(status[n] == "not checked" for n in survived)
    score = f"{100 * (killed + timed_out) / counted:.1f} %" if counted else "-"
    if unchecked:
        score += f" ({unchecked} not run)"
    rows.append((module, len(status), killed, timed_out, len(survived) - unchecked,
                 len(equivalent), score))
    survivors += [f"{n}: {status[n]}" for n in sorted(survived) if status[n] != "not checked"]

if markdown:
    print("| " + " | ".join(columns) + " |")
    print("|" + "|".join("---" for _ in columns) + "|")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")
else:
    widths = [max(len(str(r[i])) for r in rows + [columns]) for i in range(len(columns))]
    for row in [columns] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    if survivors:
        print("\nsurvivors (mutmut show NAME in " + os.getcwd() + "):")
        print("\n".join("  " + s for s in survivors))
if stale:
    print("\nequivalent-mutant entries that no longer match (not subtracted):")
    print("\n".join("  " + s for s in stale))
PY
