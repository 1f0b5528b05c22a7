"""benchmarks/ledger_growth.py runs end to end on a short run (DuckDB only, 200 and 1000 verdicts)
and prints its table with both sizes, the growth exponents and the targets' line. Timings are
the machine's: nothing here asserts one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.scale

REPO = Path(__file__).resolve().parents[2]


def test_short_run_prints_a_table_with_both_sizes() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "ledger_growth.py"), "--sizes", "200,1000", "--stores", "duckdb",
         "--appends", "5", "--repeats", "3", "--verify-repeats", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "Postgres" not in out.split("\n\n", 1)[1]  # --stores duckdb: no Postgres table, no server
    table = out[out.index("DuckDB "):]
    assert re.search(r"verdicts\s+chain rows\s+\|\s+append ms/row", table)
    sizes = [int(m.group(1)) for m in re.finditer(r"^\s+(\d+)\s+(\d+)\s+\|", table, re.M)]
    assert sizes == [200, 1000]
    for line in re.finditer(r"^\s+(?:200|1000)\s+(\d+)\s+\|(.*)$", table, re.M):
        assert int(line.group(1)) > 0  # chain rows held
        assert re.findall(r"\d+\.\d+", line.group(2))  # timings printed, whatever they are
    assert "growth exponent k" in table
    assert "targets at 100000 verdicts: not measured" in table  # no PASS/MISS claimed off a short run


def test_sizes_must_increase() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "ledger_growth.py"), "--sizes", "1000,200",
                           "--stores", "duckdb"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--sizes must increase" in proc.stderr
