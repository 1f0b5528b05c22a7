"""The ledgers the ledger tests start from, filled once per test process and copied per test
(issue 30): filling one opens a writer per append, about a second a ledger, and the verify tests
each need a fresh one to tamper with. A copy of the file is the same ledger, row for row and hash
for hash; the tests that check how a ledger is filled fill their own."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from tica.ledger import Ledger

_BUILT: dict[str, Path] = {}
_ROOT: list[Path] = []


def _root() -> Path:
    if not _ROOT:
        _ROOT.append(Path(tempfile.mkdtemp(prefix="tica-ledger-templates-")))
        atexit.register(shutil.rmtree, _ROOT[0], True)
    return _ROOT[0]


def copied(dest: Path, name: str, fill: Callable[[Ledger], None]) -> Ledger:
    """A ledger at `dest` holding what `fill` appends to an empty ledger (filled once per process
    under `name`, then its files copied; the writers' lock file is not copied)."""
    src = _BUILT.get(name)
    if src is None:
        src = _root() / name / "l.duckdb"
        fill(Ledger(src))
        _BUILT[name] = src
    dest.parent.mkdir(parents=True, exist_ok=True)
    for f in src.parent.glob(src.name + "*"):
        if not f.name.endswith(".lock"):
            shutil.copy2(f, dest.with_name(dest.name + f.name[len(src.name):]))
    return Ledger(dest)
