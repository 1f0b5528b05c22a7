#!/usr/bin/env bash
# The main command: install, run the acceptance job on the embedded default (DuckDB ledger in
# data/, CPU legs with vLLM's CPU build, the demo candidates plus the replayed H200 track), then
# open the Dagster UI on http://127.0.0.1:3000 over the same kept instance.
#   bash scripts/demo.sh            # everything, then the UI (Ctrl-C stops it)
#   bash scripts/demo.sh --no-ui    # everything, then exit (non-zero when a Dagster run failed)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export DAGSTER_HOME=${DAGSTER_HOME:-$PWD/data/dagster}
export TICA_LEDGER=${TICA_LEDGER:-$PWD/data/ledger.duckdb}
export TICA_DATA_DIR=${TICA_DATA_DIR:-$PWD/data}
export TICA_REPLAY=${TICA_REPLAY:-h200-mid4=tests/fixtures/h200,h200-mid4-tp2=tests/fixtures/h200/run5,h200-tput=tests/fixtures/h200/basis.tar.xz,h200-smollm2=tests/fixtures/h200/basis.tar.xz}
export TICA_CACHE_DIR=${TICA_CACHE_DIR:-$PWD/data/cache}
export TICA_RECEIPTS_CACHE=${TICA_RECEIPTS_CACHE:-$PWD/data/receipts}  # archived receipts (basis.tar.xz), unpacked once
rc=0
.venv/bin/python -m tica_assets.demo --models "${TICA_DEMO_MODELS:-tiny}" || rc=$?
echo
if [ "$rc" -ne 0 ]; then
  echo "demo: a step or a Dagster run failed (exit $rc); see the output above and the UI's run page" >&2
fi
echo "Query the ledger:  .venv/bin/tica --ledger $TICA_LEDGER ledger query \"SELECT * FROM track_verdicts\""
if [ "${1:-}" = "--no-ui" ]; then
  exit $rc
fi
echo "Dagster UI:        http://127.0.0.1:3000  (asset graph: each track's evidence and report)"
exec .venv/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000
