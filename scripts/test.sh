#!/usr/bin/env bash
# The test command: install what is missing, then run every test (real vLLM on the CPU included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TICA_CACHE_DIR=${TICA_CACHE_DIR:-$PWD/.tica/cache}
# Two workers (TICA_TEST_WORKERS=0 runs in this process): most tests wait on subprocesses (vLLM
# servers, Dagster runs, Postgres, Ray), so the second core is not idle; tests/conftest.py keeps
# each file on one worker (its fixtures made once) and the Ray tests together.
exec .venv/bin/python -m pytest -q -n "${TICA_TEST_WORKERS:-2}" --dist loadgroup "$@"
