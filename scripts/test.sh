#!/usr/bin/env bash
# The test command: install what is missing, then run every test (real vLLM on the CPU included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TICA_CACHE_DIR=${TICA_CACHE_DIR:-$PWD/.tica/cache}
exec .venv/bin/python -m pytest -q "$@"
