#!/usr/bin/env bash
# The test command: install what is missing, then run every test (real vLLM on the CPU included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TICA_CACHE_DIR=${TICA_CACHE_DIR:-$PWD/.tica/cache}
# Byte-code caches on: each worker, the serial phase and every process a test starts would
# otherwise compile the project and re-rewrite the test modules again (collection 21 s -> 13 s here)
unset PYTHONDONTWRITEBYTECODE
# The default runs everything in two phases: first every test not marked `serial` on two
# pytest-xdist workers, each file on one worker (--dist loadfile: its module fixtures are made once),
# the slowest files handed out first (tests/conftest.py; --no-loadscope-reorder keeps that order);
# then the `serial` tests in one process: they time a signal, a deadline or a short wait against
# the clock, and with both cores busy they failed. One exit status for both: a failure in either
# fails the run. TICA_TEST_WORKERS=N sets the first phase's workers; TICA_TEST_WORKERS=0 runs
# everything in one process.
# --fast: the everyday tier (pure core, judges, false-pass and fuzz slices; no vLLM, no browser,
# no Dagster instance, no Postgres server, no test that starts OS processes of its own), on two
# workers unless TICA_TEST_WORKERS says otherwise, in one phase (it holds no `serial` test); about
# 3 minutes on two cores (README).
PYTEST=(.venv/bin/python -m pytest -q --durations=30)
workers=${TICA_TEST_WORKERS:-2}
if [ "${1:-}" = "--fast" ]; then
  shift
  set -- -m "not slow and not browser and not long and not postgres and not processes" \
    tests/core tests/judges tests/false_pass tests/fuzz "$@"
  if [ "$workers" != 0 ]; then
    set -- -n "$workers" --dist loadfile "$@"
  fi
  exec "${PYTEST[@]}" "$@"
fi
if [ "$workers" = 0 ]; then
  exec "${PYTEST[@]}" "$@"
fi
# A `-m EXPR` of the caller's narrows both phases.
marks="" args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -m) marks="($2) and "; shift 2 ;;
    -m*) marks="(${1#-m}) and "; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
set +e
"${PYTEST[@]}" -n "$workers" --dist loadfile --no-loadscope-reorder -m "${marks}not serial" ${args[@]+"${args[@]}"}
parallel=$?
echo "== the serial tests, in one process"
serial_args=(${args[@]+"${args[@]}"})
if [ ${#serial_args[@]} -eq 0 ]; then
  # The whole suite: collect only the files that mark a test `pytest.mark.serial` (a conftest.py
  # that does: its folder), not all 3,000 tests again.
  mapfile -t serial_args < <(grep -rl --include='*.py' 'mark\.serial' tests | sed 's#/conftest\.py$##' | sort -u)
fi
"${PYTEST[@]}" -m "${marks}serial" ${serial_args[@]+"${serial_args[@]}"}
serial=$?
set -e
# 5: no test selected in that phase (a file without a serial test, say): not a failure of its own
if [ "$parallel" = 5 ] && [ "$serial" = 5 ]; then
  exit 5
fi
for rc in "$parallel" "$serial"; do
  if [ "$rc" != 0 ] && [ "$rc" != 5 ]; then
    exit "$rc"
  fi
done
exit 0
