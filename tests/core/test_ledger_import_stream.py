"""`tica ledger import` streams its export: a file larger than any single input may be (strict_io's
MAX_BYTES, 256 MiB) imports row for row, the checking pass holds one row at a time, and a file
that changes between the check and the insert leaves the target empty. The export is generated on
the fly (benchmarks/ledger_import.py), never committed; TICA_TESTS=full imports 2 GiB."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.long import size
from tica import strict_io
from tica.errors import InputError
from tica.ledger import Ledger
from tica.ledger.transfer import ExportRows

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from ledger_import import write_export  # noqa: E402


@pytest.fixture(scope="module")
def big_export(tmp_path_factory) -> tuple[Path, int, str]:
    path = tmp_path_factory.mktemp("export") / "chain.jsonl"
    rows, head = write_export(path, size(270, 2048), 2)
    assert path.stat().st_size > strict_io.MAX_BYTES  # what no whole-file reader of TICA's takes
    return path, rows, head


def _peak_of_check(path: Path) -> tuple[list[str], float]:
    """The checking pass in a child of its own: its output and its peak RSS in MiB (VmHWM of the
    child's own memory: ru_maxrss would count the forking parent's pages too)."""
    code = ("import sys\nfrom tica.ledger.transfer import ExportRows\ne = ExportRows(sys.argv[1])\n"
            "n = sum(1 for _ in e)\nhwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0]\n"
            "print(n, e.head.seq, int(hwm.split()[1]))")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    *out, kib = proc.stdout.split()
    return out, int(kib) / 1024


@pytest.mark.processes
def test_an_export_larger_than_any_input_file_imports_row_for_row(big_export, tmp_path):
    path, rows, head = big_export
    target = tmp_path / "target.duckdb"
    proc = subprocess.run([sys.executable, "-m", "tica.cli", "--ledger", str(target), "ledger", "import", str(path)],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = Ledger(target).verify()
    assert report.ok and (report.rows, report.head_seq, report.head_hash) == (rows, rows, head)


@pytest.mark.processes
def test_checking_an_export_holds_one_row_at_a_time(big_export):
    """The checking pass over a file larger than 256 MiB peaks far below the file's size (a
    whole-file read alone would take the file's size)."""
    path, rows, _ = big_export
    out, peak = _peak_of_check(path)
    assert out == [str(rows), str(rows)], out
    assert peak < path.stat().st_size / 2**20 / 4, f"checking peaked at {peak:.0f} MiB"


def test_a_file_that_changes_between_check_and_insert_leaves_the_target_empty(tmp_path):
    """Relation: the same export, its last row rewritten (a valid chain of another head) after
    the check, is refused by the insert pass, and the import's one transaction leaves no row."""
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    write_export(first, 1, 64)
    write_export(second, 1, 32)  # another valid chain
    checked = ExportRows(first)
    for _ in checked:
        pass
    first.write_bytes(second.read_bytes())  # the file changes after the check
    target = Ledger(tmp_path / "t.duckdb")
    with pytest.raises(InputError, match="changed while it was read"):
        target.insert_chain(row for _, row in ExportRows(first, expect=checked.head))
    assert target.query("SELECT count(*) FROM ledger_chain")[1] == [(0,)]


def test_a_line_longer_than_a_row_may_be_is_refused_by_number(tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"format": "tica.ledger-export/1"}) + "\n" + "x" * 100 + "\n")
    with pytest.raises(strict_io.StrictInputError, match="line 2: longer than the 60 bytes"):
        list(strict_io.regular_file_lines(path, max_line=60))
