"""The one place that chooses a store from a target: a `postgresql://` address opens the Postgres
ledger (tica.ledger.postgres_store), anything else is a DuckDB file (tica.ledger.duckdb_store).
The CLI (`--ledger`), the Dagster resource, the settings and the demo all ask here."""

from __future__ import annotations

from pathlib import Path

from tica.ledger.duckdb_store import Ledger
from tica.ledger.interface import LedgerMissing
from tica.ledger.postgres_store import PostgresLedger

SCHEMES = ("postgresql://", "postgres://")


def is_postgres(target: str | Path) -> bool:
    """Whether `target` is a Postgres address (else a DuckDB file path)."""
    return str(target).startswith(SCHEMES)


def open_ledger(target: str | Path, lock_timeout_s: float = 30.0, create: bool = False) -> Ledger | PostgresLedger:
    """The ledger at `target`: a postgresql:// address or a DuckDB file path. `create`: a ledger
    that is not there yet (no file; a database without the ledger's schema) is initialised."""
    if is_postgres(target):
        pg = PostgresLedger(str(target), lock_timeout_s=lock_timeout_s)
        if not create:
            return pg
        try:
            return pg.require_exists()
        except LedgerMissing:
            return pg.init()
    ledger = Ledger(target, lock_timeout_s=lock_timeout_s)
    if create and not ledger.path.exists():
        ledger.init()
    return ledger


def default_ledger_path() -> Path:
    from tica.settings import setting

    return Path(setting("ledger"))
