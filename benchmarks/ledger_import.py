"""`tica ledger import` of an export larger than any single input file may be, generated on the fly
(nothing committed), against its peer: reading the same file once, line by line, in Python.

    .venv/bin/python benchmarks/ledger_import.py --mib 2048 [--row-kib 1024] [--postgres DSN]

The export holds question rows whose body is `--row-kib` of text, chained exactly as `tica ledger
export` writes them. Prints the export's size, the import's wall time and peak memory (a child
process's max RSS) beside the plain read's, and their ratios. Nothing here is asserted;
tests/scale/test_ledger_import_stream.py runs a short size and checks the rows and the memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tica.ledger.chain import GENESIS, row_hash
from tica.ledger.transfer import FORMAT

ROOT = Path(__file__).resolve().parents[1]


def write_export(path: Path, mib: int, row_kib: int) -> tuple[int, str]:
    """An export of about `mib` MiB; returns (rows, head hash)."""
    rows = max(1, mib * 1024 // row_kib)
    body = json.dumps({"text": "x" * (row_kib * 1024 - 16)})
    prev = GENESIS
    with path.open("w") as f:
        f.write(" " * 200 + "\n")  # the header, rewritten once the head is known
        for seq in range(1, rows + 1):
            payload = {"question_hash": f"sha256:{seq:064x}", "name": f"q{seq}", "item": "forward",
                       "source_path": None, "body_json": body}
            at = "2026-12-06T00:00:00+00:00"
            digest = row_hash(prev, "questions", seq, at, payload)
            f.write(json.dumps({"seq": seq, "table": "questions", "prev_hash": prev, "row_hash": digest,
                                "recorded_at": at, "payload": payload}, sort_keys=True, separators=(",", ":")) + "\n")
            prev = digest
    header = json.dumps({"format": FORMAT, "rows": rows, "head": {"seq": rows, "row_hash": prev}}, sort_keys=True)
    with path.open("r+") as f:
        f.write(header.ljust(200))
    return rows, prev


def child(code: list[str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall seconds and peak RSS (MiB) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    proc = subprocess.run(code, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 1024, proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=2048)
    ap.add_argument("--row-kib", type=int, default=1024)
    ap.add_argument("--postgres", default=None, help="a Postgres DSN to import into instead of a DuckDB file")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        export = Path(tmp) / "chain.jsonl"
        rows, head = write_export(export, a.mib, a.row_kib)
        size = export.stat().st_size / 2**20
        peer_wall, peer_rss, peer = child([sys.executable, "-c", "import sys\nn = 0\n"
                                           "for line in open(sys.argv[1], 'rb'): n += 1\nprint(n)", str(export)])
        target = a.postgres or str(Path(tmp) / "target.duckdb")
        wall, rss, proc = child([sys.executable, "-m", "tica.cli", "--ledger", target, "ledger", "import", str(export)])
        if proc.returncode != 0:
            print(proc.stdout + proc.stderr)
            return proc.returncode
    print(f"export: {size:.0f} MiB, {rows} rows of {a.row_kib} KiB (head {head[:12]})")
    print(f"{'':24}{'wall s':>10}{'peak RSS MiB':>15}")
    print(f"{'plain read (peer)':24}{peer_wall:>10.1f}{peer_rss:>15.0f}")
    print(f"{'tica ledger import':24}{wall:>10.1f}{rss:>15.0f}")
    print(f"ratio import/peer: wall {wall / peer_wall:.1f}x, peak RSS {rss / peer_rss:.1f}x; "
          f"peak RSS / export size {rss / size:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
