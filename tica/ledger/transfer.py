"""Moving a chain between ledgers with every hash preserved: `tica ledger export` writes a
verified chain as JSON Lines, `tica ledger import` rebuilds it in an empty ledger.

    {"format": "tica.ledger-export/1", "rows": N, "head": {"seq": N, "row_hash": "..."}}
    {"seq": 1, "table": "questions", "prev_hash": "genesis", "row_hash": "...", "recorded_at": "...", "payload": {...}}
    ...

Import checks everything before it writes anything: the header, each line's table and columns,
value types, the link to the row before it, and each row's hash recomputed from its content; the
last row must be the header's head. A file that fails any of these is refused naming its line and
field (exit 4) and the target is untouched; a target that already holds rows is refused too (a
chain is moved whole, never merged). The file is streamed, twice (check, then insert checking
again): TICA holds one row at a time, whatever the export's size; the store's one import
transaction holds what that store holds (DuckDB keeps the uncommitted rows in memory).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tica import strict_io
from tica.errors import InputError, LedgerIntegrityError, input_lines
from tica.ledger.chain import GENESIS, Head, row_hash
from tica.ledger.interface import LedgerStore
from tica.ledger.postgres_store import PostgresLedger
from tica.ledger.schema import TABLES

FORMAT = "tica.ledger-export/1"
_ROW_KEYS = {"seq", "table", "prev_hash", "row_hash", "recorded_at", "payload"}


def chain_rows(ledger: LedgerStore) -> Iterator[dict[str, Any]]:
    """Every row of the chain in seq order, as the export writes it."""
    with ledger.reader() as con:
        entries = ledger.chain_entries(con)
    for seq, table, prev, digest, at, values in entries:
        payload = dict(zip((n for n, _ in TABLES[table]), values))
        yield {"seq": seq, "table": table, "prev_hash": prev, "row_hash": digest, "recorded_at": at, "payload": payload}


def export_chain(ledger: LedgerStore, out: str | Path) -> Head:
    """Write the verified chain to `out` (a chain that does not verify is not exported)."""
    report = ledger.verify_or_raise()
    head = report.head
    tmp = Path(f"{out}.partial")
    with tmp.open("w") as f:
        f.write(json.dumps({"format": FORMAT, "rows": report.rows,
                            "head": {"seq": head.seq, "row_hash": head.row_hash}}, sort_keys=True) + "\n")
        for row in chain_rows(ledger):
            f.write(json.dumps(row, sort_keys=True, separators=(",", ":")) + "\n")
    tmp.replace(out)
    return head


def _checked_value(path: Path, line: int, field: str, kind: str, value: Any) -> Any:
    if value is None:
        return None
    if kind == "BIGINT" and (type(value) is not int):
        raise InputError(path, field, f"must be an integer or null, got {value!r}", line)
    if kind == "VARCHAR" and not isinstance(value, str):
        raise InputError(path, field, f"must be a string or null, got {value!r}", line)
    return value


def _checked_row(path: Path, line: int, data: Any, seq: int, prev: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    if not isinstance(data, dict) or set(data) != _ROW_KEYS:
        raise InputError(path, "<row>", f"a row has exactly the keys {sorted(_ROW_KEYS)}", line)
    table = data["table"]
    if table not in TABLES:
        raise InputError(path, "table", f"no ledger table {table!r}", line)
    if data["seq"] != seq:
        raise InputError(path, "seq", f"{data['seq']!r}, expected {seq} (rows out of order, missing or repeated)", line)
    if data["prev_hash"] != prev:
        raise InputError(path, "prev_hash", "does not link to the row before it", line)
    if not isinstance(data["recorded_at"], str) or not isinstance(data["row_hash"], str):
        raise InputError(path, "recorded_at", "recorded_at and row_hash must be strings", line)
    payload = data["payload"]
    columns = dict(TABLES[table])
    if not isinstance(payload, dict) or set(payload) != set(columns):
        raise InputError(path, "payload", f"the columns of {table} are exactly {sorted(columns)}", line)
    checked = {n: _checked_value(path, line, f"payload.{n}", columns[n], payload[n]) for n, _ in TABLES[table]}
    if row_hash(prev, table, seq, data["recorded_at"], checked) != data["row_hash"]:
        raise InputError(path, "row_hash", "does not match the row's content (edited after export)", line)
    return table, data, checked


Row = tuple[str, dict[str, Any], dict[str, Any]]


def _header(path: Path, n: int, text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        header = strict_io.loads(text)
    except strict_io.StrictInputError as err:
        raise InputError(path, "<header>", f"not JSON: {err}", n) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise InputError(path, "format", f"not a {FORMAT} file", n)
    head = header.get("head")
    if not (isinstance(head, dict) and type(head.get("seq")) is int and isinstance(head.get("row_hash"), str)
            and type(header.get("rows")) is int):
        raise InputError(path, "head", "the header names the chain's rows and head {seq, row_hash}", n)
    return header, head


class ExportRows:
    """An export's rows, streamed and each checked as it is read: iterating yields (line, (table,
    chain columns, payload)); the header's count and head are checked after the last row, and only
    then is `head` set (a caller that stops early has not seen a whole export). `expect`: the head
    an earlier pass over the same file found; another one is refused before the last row is handed
    on. InputError on the first problem."""

    def __init__(self, path: str | Path, expect: Head | None = None) -> None:
        self.path, self.expect = Path(path), expect
        self.head: Head | None = None

    def __iter__(self) -> Iterator[tuple[int, Row]]:
        path = self.path
        lines = input_lines(path)
        first = next(lines, None)
        if first is None:
            raise InputError(path, "<header>", "empty file: not a ledger export")
        header, head = _header(path, *first)
        count, prev, last_seq, last_at = 0, GENESIS, 0, ""
        pending: tuple[int, Row] | None = None  # one row held back until the file's end is checked
        for n, text in lines:
            try:
                data = strict_io.loads(text)
            except strict_io.StrictInputError as err:
                raise InputError(path, "<row>", f"not JSON: {err}", n) from None
            table, data, payload = _checked_row(path, n, data, count + 1, prev)
            count, prev, last_seq, last_at = count + 1, data["row_hash"], data["seq"], data["recorded_at"]
            if pending is not None:
                yield pending
            pending = (n, (table, data, payload))
        if count != header["rows"]:
            raise InputError(path, "rows", f"the header says {header['rows']} rows, the file holds {count} (truncated?)")
        if count and (last_seq, prev) != (head["seq"], head["row_hash"]) or not count and head["seq"] != 0:
            raise InputError(path, "head", "the last row is not the header's head")
        found = Head(seq=head["seq"], row_hash=head["row_hash"], recorded_at=last_at)
        if self.expect is not None and found != self.expect:
            raise InputError(path, "head", "the file changed while it was read: its head is not the one checked before")
        self.head = found
        if pending is not None:
            yield pending


def read_export(path: str | Path) -> tuple[Head, list[Row]]:
    """The export's head and its rows, every one checked; InputError on the first problem."""
    export = ExportRows(path)
    rows = [row for _, row in export]
    assert export.head is not None  # set once every row was read
    return export.head, rows


def _no_nul(path: Path, line: int, row: Row) -> None:
    table, data, payload = row
    for field, value in [*((f"payload.{k}", v) for k, v in payload.items()), *data.items()]:
        if isinstance(value, str) and "\x00" in value:
            raise InputError(path, field, f"{table} seq {data['seq']} holds a NUL character, which Postgres "
                             "text cannot store: this chain cannot move there with its hashes", line)


def import_chain(ledger: LedgerStore, path: str | Path) -> Head:
    """Rebuild the exported chain in `ledger`, which must hold no rows; every hash preserved.

    Streamed in two passes, each holding one row at a time: the first checks every row (and, for
    Postgres, that no text holds a NUL) before anything is written; the second checks each row
    again as it inserts it, in the store's one import transaction, so a file changed between the
    passes is refused and leaves the target empty."""
    checked = ExportRows(path)
    postgres = isinstance(ledger, PostgresLedger)
    for line, row in checked:
        if postgres:
            _no_nul(checked.path, line, row)
    assert checked.head is not None
    head = checked.head
    ledger.insert_chain(row for _, row in ExportRows(path, expect=head))
    report = ledger.verify()
    if not report.ok or (report.head_seq, report.head_hash) != (head.seq, head.row_hash):
        raise LedgerIntegrityError("imported chain does not verify to the export's head: " + "; ".join(report.problems))
    return report.head
