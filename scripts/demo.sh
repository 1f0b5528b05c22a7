#!/usr/bin/env bash
# The main command: install, run the acceptance job on the embedded default (DuckDB ledger in
# data/, CPU legs with vLLM's CPU build, the demo candidates plus the replayed H200 tracks), print
# each track's answer, then open the Dagster UI over the same kept instance.
#   bash scripts/demo.sh              # everything, then the UI on http://127.0.0.1:3000 (Ctrl-C stops it)
#   bash scripts/demo.sh --port 3100  # the UI on another port
#   bash scripts/demo.sh --no-ui      # everything, then exit (non-zero when a Dagster run failed)
set -euo pipefail
cd "$(dirname "$0")/.."
port=3000
ui=1
while [ $# -gt 0 ]; do
  case "$1" in
    --no-ui) ui=0 ;;
    --port) port=${2:?--port needs a number}; shift ;;
    --port=*) port=${1#--port=} ;;
    -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo.sh: unknown option $1 (see --help)" >&2; exit 4 ;;
  esac
  shift
done
case "$port" in (*[!0-9]*|'') echo "demo.sh: --port $port is not a port number" >&2; exit 4 ;; esac
mkdir -p data
# The installers' own warnings are not the user's business: kept in data/setup.log.
if ! bash scripts/setup.sh > data/setup.log 2>&1; then
  tail -n 20 data/setup.log >&2
  echo "demo.sh: setup failed; the whole output is in data/setup.log" >&2
  exit 1
fi
export DAGSTER_HOME=${DAGSTER_HOME:-$PWD/data/dagster}
export TICA_LEDGER=${TICA_LEDGER:-$PWD/data/ledger.duckdb}
export TICA_DATA_DIR=${TICA_DATA_DIR:-$PWD/data}
export TICA_REPLAY=${TICA_REPLAY:-h200-mid4=tests/fixtures/h200,h200-mid4-tp2=tests/fixtures/h200/run5,h200-tput=tests/fixtures/h200/basis.tar.xz,h200-smollm2=tests/fixtures/h200/basis.tar.xz,h200-accept=tests/fixtures/h200/accept.tar.xz,h200-accept-stock=tests/fixtures/h200/accept.tar.xz}
export TICA_CACHE_DIR=${TICA_CACHE_DIR:-$PWD/data/cache}
export TICA_TRUSTED_KEYS=${TICA_TRUSTED_KEYS:-$PWD/demo/trusted-keys}  # signed freeze chains (frozen/) of replayed receipts
export TICA_RECEIPTS_CACHE=${TICA_RECEIPTS_CACHE:-$PWD/data/receipts}  # archived receipts (basis.tar.xz), unpacked once
rc=0
.venv/bin/python -m tica_assets.demo --models "${TICA_DEMO_MODELS:-tiny}" || rc=$?
echo
if [ "$rc" -ne 0 ]; then
  echo "demo: a step or a Dagster run failed (exit $rc); see the output above and the UI's run page" >&2
fi
echo "Query the ledger:  .venv/bin/tica --ledger data/ledger.duckdb ledger query \"SELECT * FROM track_verdicts\""
echo "The report again:  .venv/bin/tica --ledger data/ledger.duckdb report cpu-tiny --manifest demo/candidates/cpu-tiny.yaml"
if [ "$ui" -eq 0 ]; then
  exit $rc
fi
echo "Dagster UI:        http://127.0.0.1:$port  (asset graph: each track's evidence and report; h200-matrix: the matrix tables)"
exec .venv/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p "$port"
