#!/usr/bin/env bash
# Mutation testing (mutmut 3) of the judges: bash scripts/mutation.sh [MODULE ...]   (docs/mutation.md)
#
# MODULE: a source file under tica/ (tica/judges/*.py, tica/binding.py ...). None given: the small,
# fast default set of [tool.mutmut] only_mutate in pyproject.toml (a few minutes on 2 cores).
# Each module brings its own fast test selection (tests_for below); MUTATION_TESTS="FILE ..."
# replaces it. The full scope of issue 27 is a long run (hours on 2 cores):
#   bash scripts/mutation.sh tica/judges/*.py tica/binding.py tica/checks.py tica/canaries.py
#
# mutmut runs in a fresh snapshot of tica/, tests/, demo/ and pyproject.toml under MUTATION_WORKDIR
# (default ${TMPDIR:-/tmp}/tica-mutation), never in the working tree: parallel edits cannot change
# a run under way, and nothing is written to the repository. Every run starts from scratch, so a
# new test always counts. After a run, `cd $MUTATION_WORKDIR && mutmut show NAME` (or `browse`).
#
# Environment: MUTATION_JOBS (default 2) parallel mutants; MUTATION_TIMEOUT seconds for the whole
# run (default 0: none); MUTATION_NICE (default 10).
# Exit status: 0 every surviving mutant is explained in docs/mutation.md; 3 some survivor is not
# (each is printed with its diff); 1 mutmut itself failed (its log is printed).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
MUTMUT="$ROOT/.venv/bin/mutmut"
[ -x "$PY" ] || bash scripts/setup.sh
[ -x "$MUTMUT" ] || "$ROOT/.venv/bin/pip" install -q --disable-pip-version-check mutmut==3.8.1

KILLS=tests/core/test_mutation_kills.py
# The fast tests that exercise a module; other modules: the judge and false-pass suites.
tests_for() {
  case "$1" in
    tica/leg_times.py) echo tests/false_pass/test_self_contradicting_receipts.py tests/false_pass/test_content_classes.py ;;
    tica/unknowns.py) echo tests/judges/test_unknowns.py tests/judges/test_receipts.py \
                           tests/false_pass/test_content_classes.py tests/core/test_receipt_fields.py ;;
    tica/digests.py) echo tests/false_pass/test_content_classes.py ;;
    tica/process_exits.py|tica/items/clean_exit/judge.py) echo tests/judges/test_clean_exit.py ;;
    *) echo tests/judges tests/false_pass ;;
  esac
}

if [ $# -eq 0 ]; then
  mapfile -t modules < <("$PY" -c 'import tomllib; [print(m) for m in tomllib.load(open("pyproject.toml", "rb"))["tool"]["mutmut"]["only_mutate"]]')
else
  modules=()
  for m in "$@"; do
    m=${m#./}
    case "$m" in tica/*.py) ;; *) echo "not a module under tica/: $m" >&2; exit 2 ;; esac
    [ -f "$m" ] || { echo "no such file: $m" >&2; exit 2; }
    modules+=("$m")
  done
fi
if [ -n "${MUTATION_TESTS:-}" ]; then
  read -r -a tests <<<"$MUTATION_TESTS"
else
  tests=("$KILLS")
  for m in "${modules[@]}"; do read -r -a t <<<"$(tests_for "$m")"; tests+=("${t[@]}"); done
fi
mapfile -t tests < <(printf '%s\n' "${tests[@]}" | awk '!seen[$0]++' | while read -r t; do [ -e "$t" ] && echo "$t"; done)
[ ${#tests[@]} -gt 0 ] || { echo "no test file of the selection exists" >&2; exit 2; }

WORK=${MUTATION_WORKDIR:-${TMPDIR:-/tmp}/tica-mutation}
if [ -e "$WORK" ]; then
  [ -f "$WORK/.tica-mutation" ] || { echo "$WORK exists and is not a mutation work folder: not touching it" >&2; exit 2; }
  rm -rf "$WORK"
fi
mkdir -p "$WORK"
touch "$WORK/.tica-mutation"
tar -C "$ROOT" --exclude=__pycache__ --exclude=.pytest_cache --exclude=.hypothesis -cf - tica tests demo | tar -C "$WORK" -xf -
# pyproject.toml with this run's [tool.mutmut]: the repository's, only_mutate and tests replaced
"$PY" - "$WORK" "${#modules[@]}" "${modules[@]}" "${tests[@]}" <<'EOF'
import json, re, sys, tomllib
work, n = sys.argv[1], int(sys.argv[2])
modules, tests = sys.argv[3:3 + n], sys.argv[3 + n:]
text = open("pyproject.toml", encoding="utf-8").read()
conf = tomllib.loads(text)["tool"]["mutmut"]
conf.update(only_mutate=modules, pytest_add_cli_args_test_selection=tests, use_git_change_detection=False)
text = re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[|\Z)", "", text)
text += "\n[tool.mutmut]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in conf.items())
tomllib.loads(text)  # still TOML
open(f"{work}/pyproject.toml", "w", encoding="utf-8").write(text)
EOF

echo "mutation: $(${MUTMUT} --version 2>/dev/null | tail -1); modules: ${modules[*]}"
echo "mutation: tests: ${tests[*]}"
echo "mutation: work folder $WORK (log: $WORK/mutmut-run.log)"
cd "$WORK"
start=$(date +%s)
rc=0
nice -n "${MUTATION_NICE:-10}" timeout "${MUTATION_TIMEOUT:-0}" \
  "$MUTMUT" run --max-children "${MUTATION_JOBS:-2}" >mutmut-run.log 2>&1 || rc=$?
wall=$(( $(date +%s) - start ))
if [ $rc -ne 0 ]; then
  tr '\r' '\n' <mutmut-run.log | tail -40
  echo "mutation: mutmut run failed (exit $rc after ${wall}s)" >&2
  exit 1
fi
"$MUTMUT" results --all true >mutmut-results.txt 2>/dev/null
# Score: killed (a test failed, or the mutant ran out of time) over every mutant made.
MUTMUT="$MUTMUT" "$PY" - "$ROOT/docs/mutation.md" "$wall" <<'EOF' || rc=$?
import collections, os, subprocess, sys
docs = open(sys.argv[1], encoding="utf-8").read() if os.path.exists(sys.argv[1]) else ""
rows = [line.strip().rsplit(": ", 1) for line in open("mutmut-results.txt", encoding="utf-8") if ": " in line]
by = collections.Counter(status for _, status in rows)
killed = by["killed"] + by["timeout"] + by["caught by type check"]
total = len(rows)
live = sorted(name for name, status in rows if status not in ("killed", "timeout", "caught by type check"))
print(f"\nmutation score: {killed}/{total} killed ({100 * killed / max(total, 1):.1f}%) in {sys.argv[2]} s; "
      + ", ".join(f"{s} {c}" for s, c in sorted(by.items())))
unexplained = [n for n in live if n not in docs]
for name in live:
    status = dict(rows)[name]
    print(f"  {status}: {name}" + ("" if name in docs else "   <- not explained in docs/mutation.md"))
for name in unexplained:
    print(subprocess.run([os.environ.get("MUTMUT", "mutmut"), "show", name], capture_output=True, text=True).stdout)
sys.exit(3 if unexplained else 0)
EOF
exit $rc
