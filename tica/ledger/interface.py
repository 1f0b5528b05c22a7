"""What every store offers (LedgerStore: the DuckDB file, tica.ledger.duckdb_store, and the Postgres
database, tica.ledger.postgres_store, both satisfy it) and the errors its verbs raise. Callers that
take any store type against this; tica.ledger.store opens the one a target names."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from tica.errors import TicaError
from tica.ledger.chain import Head, VerifyReport

# SQL a person types (`tica ledger query`) returns at most this many rows, on either store.
QUERY_MAX_ROWS = 100_000

Entry = tuple[int, str, str, str, str, tuple]  # (seq, table, prev_hash, row_hash, recorded_at, payload values)
Decide = Callable[[Callable[..., list[dict[str, Any]]]], Sequence[tuple[str, Mapping[str, Any]]]]


class LedgerLockTimeout(TicaError):
    """Another writer held the ledger longer than the bounded wait."""


class QueryRefused(TicaError):
    """SQL a person typed that the ledger will not answer as asked (too many rows)."""


class LedgerMissing(TicaError):
    """A read of a ledger file that does not exist (a mistyped path is not an empty ledger)."""


class LedgerStore(Protocol):
    """The append-only ledger's verbs, whatever holds it."""

    @property
    def path(self) -> Path | str:
        """What messages name: the file, or the address without its password."""

    def init(self) -> LedgerStore: ...

    def require_exists(self) -> LedgerStore: ...

    def append(self, table: str, row: Mapping[str, Any]) -> int: ...

    def append_many(self, rows: Sequence[tuple[str, Mapping[str, Any]]]) -> list[int]: ...

    def check_and_append(self, decide: Decide) -> tuple[Any, list[int]]: ...

    def insert_chain(self, rows: Iterable[tuple[str, Mapping[str, Any], Mapping[str, Any]]]) -> None: ...

    def session(self) -> AbstractContextManager[Any]: ...

    def reading(self) -> AbstractContextManager[Any]: ...

    def reader(self, sandboxed: bool = False) -> AbstractContextManager[Any]: ...

    def query(self, sql: str, params: Sequence[Any] | None = None,
              sandboxed: bool = False) -> tuple[list[str], list[tuple]]: ...

    def rows(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]: ...

    def track_verdicts(self, track: str) -> list[dict[str, Any]]: ...

    def chain_entries(self, con: Any) -> list[Entry]: ...

    def verify(self, expect: Head | None = None, in_db: bool | None = None) -> VerifyReport: ...

    def verify_or_raise(self, expect: Head | None = None) -> VerifyReport: ...
