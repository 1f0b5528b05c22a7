"""Connections to a store, opened with bounded retries: a DuckDB file another process holds, a
Postgres server that is not answering yet. Below the stores, so that the processes of a parallel
verify (tica.ledger.parallel) and the readers on a Postgres snapshot (tica.ledger.batches) open
what the stores open without importing them."""

from __future__ import annotations

import random
import re
import time
from pathlib import Path
from typing import Any

import duckdb

from tica.errors import TicaError

_LOCK_ERROR = re.compile(r"could not set lock|conflicting lock|\block on file\b|being used by another", re.I)


def is_lock_error(err: Exception) -> bool:
    """DuckDB's "another process holds this file" (not any message that happens to say "block")."""
    return bool(_LOCK_ERROR.search(str(err)))


def connect_duckdb(path: Path, read_only: bool, timeout_s: float,
                   config: dict | None = None) -> duckdb.DuckDBPyConnection:
    """The DuckDB file at `path`, retried while another process holds it, for at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only, config=config or {})
        except duckdb.Error as err:  # another process holds the file
            if not is_lock_error(err) or time.monotonic() > deadline:
                raise TicaError(f"{path}: cannot open ledger: {err}") from err
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 0.5)


def redacted(dsn: str) -> str:
    """The address without its password (`postgresql://user:***@host/db`)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def psycopg_module() -> Any:
    """psycopg, imported when a Postgres ledger is first used (the scale profile's dependency)."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover - the scale profile's dependency
        raise TicaError("a postgresql:// ledger needs psycopg: pip install 'psycopg[binary]'") from None
    return psycopg


def connect_postgres(dsn: str, **kw: Any) -> Any:
    """A psycopg connection to `dsn`, retried while the server refuses (8 attempts, backing off);
    the error names the address without its password."""
    psycopg = psycopg_module()
    delay = 0.05
    for attempt in range(8):
        try:
            return psycopg.connect(dsn, **kw)
        except psycopg.OperationalError as err:
            if attempt == 7:
                raise TicaError(f"{redacted(dsn)}: cannot connect to the ledger: {str(err).strip()}") from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
