"""`tica --help` and a usage error against a bare `python -c pass`, side by side.

    .venv/bin/python benchmarks/cli_startup.py --repeats 10

Target: `tica --help` under 0.3 s. Each verb imports what it uses, so help and usage errors pay
for neither DuckDB nor pydantic nor torch; the peer is the interpreter's own start.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def wall(cmd: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    peer = wall([sys.executable, "-c", "pass"], args.repeats)
    cases = {"tica --help": [str(BIN / "tica"), "--help"],
             "tica ledger --help": [str(BIN / "tica"), "ledger", "--help"],
             "tica frobnicate (usage error)": [str(BIN / "tica"), "frobnicate"]}
    print(f"{'python -c pass (peer)':32} {peer * 1e3:7.0f} ms")
    for name, cmd in cases.items():
        t = wall(cmd, args.repeats)
        print(f"{name:32} {t * 1e3:7.0f} ms  {t / peer:.1f}x the peer (target < 300 ms)")


if __name__ == "__main__":
    main()
