"""A row on its way into a store (its payload checked against TABLES, stored and hashed as the
store reads it back) and the rows on their way out (one table's rows streamed in seq order, on any
store's cursor)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from tica.errors import TicaError
from tica.ledger.schema import CHAIN_COLUMNS, TABLES


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def checked_payload(table: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """`row` as `table`'s payload, every column of TABLES in its order: a bool stored as an integer,
    any other value of a text column as compact JSON; an unknown table or column, or a non-integer
    for an integer column, refused."""
    if table not in TABLES:
        raise TicaError(f"ledger has no table {table!r}")
    columns = TABLES[table]
    unknown = set(row) - {n for n, _ in columns}
    if unknown:
        raise TicaError(f"ledger table {table} has no column(s) {sorted(unknown)}")
    payload: dict[str, Any] = {}
    for name, kind in columns:
        value = row.get(name)
        if isinstance(value, bool):
            value = int(value)  # stored and hashed as the integer DuckDB reads back
        if value is not None and kind == "BIGINT" and not isinstance(value, int):
            raise TicaError(f"ledger {table}.{name} must be an integer, got {value!r}")
        if value is not None and kind == "VARCHAR" and not isinstance(value, str):
            value = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
        payload[name] = value
    return payload


class OutOfOrder(Exception):
    """A table read as stored was not in seq order: read it again sorted."""


def table_stream(cur: Any, table: str, chunk_rows: int, ordered: bool = True
                 ) -> Iterator[tuple[int, str, str, str, str, tuple]]:
    """One table's rows as chain entries in seq order, fetched `chunk_rows` at a time on `cur`
    (a cursor no other query uses meanwhile). Unordered: as stored, checked to be in seq order."""
    names = [n for n, _ in TABLES[table]]
    cur.execute(f"SELECT {', '.join((*CHAIN_COLUMNS, *names))} FROM {table}{' ORDER BY seq' if ordered else ''}")
    last = None
    while True:
        rows = cur.fetchmany(chunk_rows)
        if not rows:
            return
        if not ordered:
            for r in rows:
                if last is not None and not last < r[0]:
                    raise OutOfOrder(table)
                last = r[0]
        for r in rows:
            yield (r[0], table, r[1], r[2], r[3], tuple(r[4:]))
