"""A row on its way into a store (its payload checked against TABLES, stored and hashed as the
store reads it back) and the rows on their way out (one table's rows streamed in seq order, on any
store's cursor)."""

from __future__ import annotations

import gc
import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
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
    if not _COLUMN_SETS[table].issuperset(row):
        raise TicaError(f"ledger table {table} has no column(s) {sorted(set(row) - _COLUMN_SETS[table])}")
    payload = _AS_THEY_ARE[table](row)
    if payload is not None:
        return payload
    payload = {}
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


_COLUMN_SETS = {t: frozenset(n for n, _ in cols) for t, cols in TABLES.items()}


def _as_they_are_source(table: str) -> str:
    """The source of a function of a row of `table` (its keys checked) that returns its payload when
    every value is None, an exact str in a text column or an exact int in an integer column (what
    checked_payload's loop leaves as it is), else None (the loop decides)."""
    columns = TABLES[table]
    kinds = {"VARCHAR": "str", "BIGINT": "int"}
    lines = ["def as_they_are(row):", "    get = row.get"]
    lines += [f"    v{k} = get({name!r})" for k, (name, _) in enumerate(columns)]
    test = " and ".join(f"(v{k} is None or v{k}.__class__ is {kinds[kind]})" for k, (_, kind) in enumerate(columns))
    lines += [f"    if {test}:",
              f"        return {{{', '.join(f'{name!r}: v{k}' for k, (name, _) in enumerate(columns))}}}",
              "    return None"]
    return "\n".join(lines) + "\n"


def _make_as_they_are(table: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(compile(_as_they_are_source(table), f"<tica.ledger payload of {table}>", "exec"), namespace)  # noqa: S102
    return namespace["as_they_are"]


# table -> the payload of a row whose values need no conversion, else None: checked_payload's
# common case without its loop (a test holds both ways equal), a third of a batch append's time.
_AS_THEY_ARE = {t: _make_as_they_are(t) for t in TABLES}


def by_table(chained: Sequence[tuple[str, Mapping[str, Any], Mapping[str, Any]]]
             ) -> dict[str, list[tuple[Mapping[str, Any], Mapping[str, Any]]]]:
    """Chained rows (table, chain columns, payload), in seq order, as each table's (chain columns,
    payload) in the same order: what one append stores with a statement per table. Each table's
    rows stay in seq order, which DuckDB keeps as their stored order (table_stream reads it so)."""
    out: dict[str, list[tuple[Mapping[str, Any], Mapping[str, Any]]]] = {}
    for table, chain, payload in chained:
        out.setdefault(table, []).append((chain, payload))
    return out


@contextmanager
def gc_paused(rows: int, at_least: int = 1000) -> Iterator[None]:
    """The cyclic garbage collector off for the block when it builds `rows` (at least `at_least`)
    rows' objects: a batch append allocates a few dicts and strings per row and no cycles, and the
    collector's passes over them were a fifth of its time at 20,000 rows. Back as it was after."""
    pause = rows >= at_least and gc.isenabled()
    if pause:
        gc.disable()
    try:
        yield
    finally:
        if pause:
            gc.enable()


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
