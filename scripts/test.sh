#!/usr/bin/env bash
# The test command: install what is missing, then run every test (real vLLM on the CPU included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TICA_CACHE_DIR=${TICA_CACHE_DIR:-$PWD/.tica/cache}
# TICA_TEST_WORKERS=2 runs two pytest-xdist workers, each file on one worker (--dist loadfile: its
# module fixtures are made once; a session fixture such as the demo leg set, once per worker that
# needs it). Not the default: with both cores busy, tests that time a signal or a deadline against a
# loaded machine failed there.
# --fast: the everyday tier (pure core, judges, false-pass and fuzz slices; no vLLM, no browser,
# no Dagster instance, no Postgres server, no test that starts OS processes of its own), on two
# workers unless TICA_TEST_WORKERS says otherwise; about 3 minutes on two cores (README).
# The default runs everything, in one process.
default_workers=0
if [ "${1:-}" = "--fast" ]; then
  shift
  default_workers=2
  set -- -m "not slow and not browser and not long and not postgres and not processes" \
    tests/core tests/judges tests/false_pass tests/fuzz "$@"
fi
workers=${TICA_TEST_WORKERS:-$default_workers}
if [ "$workers" != 0 ]; then
  set -- -n "$workers" --dist loadfile "$@"
fi
exec .venv/bin/python -m pytest -q --durations=30 "$@"
