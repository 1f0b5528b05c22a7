"""Verify in the database: the chain re-hashed by the store itself (issue 15: most of a Python
verify is fetching the rows and building their bodies). The store builds each row's body with a
SQL expression written here from TABLES, byte for byte `_body`'s for every row whose text is
printable ASCII (0x20-0x7E) and NULL for any other row (never a guessed escape), hashes it with its
own sha256, and checks every row's seq, link and content in one query over the chain in chain
order. Python stays the authority: the rows whose SQL body is NULL are hashed here, and a chain
with anything at all out of place (a seq, a link, a hash, a NULL) is verified again by the Python
path, whose report names each problem exactly as it always has. The SQL runs only after the checks
that refuse functions, macros and schemas created behind the ledger, only on tables defined
exactly as the code defines them, and calls every function by its builtin's qualified name."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

from tica.ledger.chain import FAST_BODIES, GENESIS, ChainSegment, Head, VerifyReport, _quote, join_segments
from tica.ledger.schema import CHAIN_COLUMNS, TABLES

IN_DB_ENV = "TICA_VERIFY_IN_DB"  # 1: in the database first, 0: Python only; unset: the store's default
_LITERAL = re.compile(r"[A-Za-z0-9_{}\":, ]*")  # the constant text of a body: no quote, no backslash


# Off by default on DuckDB too: measured 20% faster than the Python path at 100k verdicts (7.9 vs
# 9.9 s on a loaded 2-core host), short of the 2 s target either way, and a second
# implementation of the hash spec is a second place for a false "intact" to come from. Measured
# again in session 19 (issue 32), 100k verdicts of ~3 KB, 2 shared cores: 2.9 s in the database
# against 2.1 s for the batch path then and 0.8 s for its DuckDB-built bodies (batches.py) now.
# DuckDB's sha256 hashes about 160 MB/s per thread (hashlib: 1.3 GB/s here) and the printable
# check's regexp costs as much again; Postgres builds the bodies at about 19 us a row. The batch
# path's DuckDB-built bodies keep the SQL body and leave the hashing and the check to Python.
IN_DB_DEFAULT = False


def in_db_enabled(in_db: bool | None = None, default: bool = IN_DB_DEFAULT) -> bool:
    """Whether verify hashes in the database first: `in_db` if given, else TICA_VERIFY_IN_DB (1:
    yes, 0: no), else the store's `default`. Both paths give the same report."""
    if in_db is not None:
        return in_db
    from tica.settings import setting

    env: bool | None = setting("verify_in_db")
    return default if env is None else env


class DuckDBSql:
    """The pieces of the in-database verify in DuckDB's SQL. Every function is called by its
    builtin's qualified name: a macro stored in the file shadows an unqualified name, an operator
    included (a macro named "||" takes over `a || b`), so concatenation is system.main.concat."""

    fn = "system.main."

    def call(self, name: str, *args: str) -> str:
        return f"{self.fn}{name}({', '.join(args)})"

    def literal(self, text: str) -> str:
        if not _LITERAL.fullmatch(text):
            raise ValueError(f"{text!r}: not a constant of a row's body")
        return f"'{text}'"

    def text(self, expr: str) -> str:
        """A text value as the body reads and compares it (byte for byte)."""
        return expr

    def printable(self, expr: str) -> str:
        """True when the text holds printable ASCII only (0x20-0x7E), else false (NULL for NULL)."""
        return self.call("regexp_full_match", expr, "'[ -~]*'")

    def int_text(self, expr: str) -> str:
        return f"CAST({expr} AS VARCHAR)"

    def char(self, code: int) -> str:
        return self.call("chr", str(code))

    def concat(self, *parts: str) -> str:
        """The parts' text, a NULL part skipped (every caller guards the parts that may be NULL)."""
        return self.call("concat", *parts)

    def sha256_hex(self, expr: str) -> str:
        return self.call("sha256", expr)

    def eq(self, a: str, b: str) -> str:
        return f"({a} = {b})"


def _text_pieces(sql: DuckDBSql, column: str, nullable: bool) -> list[tuple[bool, str]]:
    """json.dumps of a text value (ensure_ascii) as pieces of one concatenation, (constant?, text
    or SQL): '"' + the text with each backslash and double quote escaped by a backslash + '"', or
    'null' for NULL when `nullable` (else nothing: body_sql refuses that row). Exact for printable
    ASCII only, the only text body_sql lets through. The backslash is chr(92), never written in a
    literal: no string-literal setting (Postgres's standard_conforming_strings) can change it."""
    col = sql.text(column)
    backslash = sql.char(92)
    escaped = sql.call("replace", sql.call("replace", col, backslash, sql.concat(backslash, backslash)),
                       sql.literal('"'), sql.concat(backslash, sql.literal('"')))
    if not nullable:
        return [(True, '"'), (False, escaped), (True, '"')]
    return [(False, f"CASE WHEN {column} IS NULL THEN {sql.literal('null')} ELSE {sql.literal(chr(34))} END"),
            (False, escaped), (False, f"CASE WHEN {column} IS NOT NULL THEN {sql.literal(chr(34))} END")]


def body_parts_sql(sql: DuckDBSql, table: str) -> str:
    """`_body(table, seq, recorded_at, payload)` as one SQL concatenation over a row of `table`,
    the keys in json.dumps's sort_keys order, worked out here from TABLES: exact for a row whose
    every text value is printable ASCII and whose seq and recorded_at are set (body_sql refuses
    any other row)."""
    kinds = dict(TABLES[table])
    pieces: list[tuple[bool, str]] = [(True, '{"payload":{')]
    for k, name in enumerate(sorted(kinds)):
        pieces.append((True, ("," if k else "") + _quote(name) + ":"))
        if kinds[name] == "BIGINT":
            pieces.append((False, f"CASE WHEN {name} IS NULL THEN {sql.literal('null')} ELSE {sql.int_text(name)} END"))
        else:
            pieces += _text_pieces(sql, name, nullable=True)
    pieces += [(True, '},"recorded_at":'), *_text_pieces(sql, "recorded_at", nullable=False),
               (True, ',"seq":'), (False, sql.int_text("seq")), (True, f',"table":{_quote(table)}}}')]
    merged: list[str] = []
    constant = ""
    for is_constant, text in pieces:
        if is_constant:
            constant += text
            continue
        if constant:
            merged.append(sql.literal(constant))
            constant = ""
        merged.append(text)
    if constant:
        merged.append(sql.literal(constant))
    return sql.concat(*merged)


def _sql_body_exact(sql: DuckDBSql, table: str) -> str:
    """True for a row of `table` whose SQL body is `_body`'s: seq and recorded_at set, every text
    value printable ASCII (0x20-0x7E). Tested on the row's text values joined (a NULL one
    skipped), so that the body, computed after, is computed once per row."""
    texts = [n for n, kind in TABLES[table] if kind == "VARCHAR"] + ["recorded_at"]
    return (f"seq IS NOT NULL AND recorded_at IS NOT NULL AND "
            f"{sql.printable(sql.concat(*(sql.text(n) for n in texts)))}")


def body_sql(sql: DuckDBSql, table: str) -> str:
    """A SELECT of `table`'s chain columns and `body`: `_body(table, seq, recorded_at, payload)` byte
    for byte for a row whose seq and recorded_at are set and whose every text value is printable
    ASCII, NULL for any other row (the escaping adds printable characters only)."""
    return (f"SELECT {', '.join(CHAIN_COLUMNS)}, CASE WHEN {_sql_body_exact(sql, table)} "
            f"THEN {body_parts_sql(sql, table)} END AS body FROM {table}")


def in_db_chain_sql(sql: DuckDBSql, want: int | None) -> str:
    """One row for the whole chain: (rows, rows with anything out of place, the last row's
    row_hash and recorded_at, the stored row_hash at seq `want`, then for each table in TABLES
    order its rows whose SQL body is NULL (Python hashes those)). Chain order as merge_chain's: seq, then TABLES order for an equal seq. A row is
    in place when its seq is its position, its prev_hash the row_hash before it (genesis for the
    first) and its recomputed hash its row_hash; a NULL anywhere in that is out of place."""
    parts = []
    for k, table in enumerate(TABLES):
        digest = sql.sha256_hex(sql.concat(sql.text("prev_hash"), sql.char(10), "body"))
        parts.append(f"SELECT seq, {k} AS t, prev_hash, row_hash, recorded_at, "
                     f"CASE WHEN prev_hash IS NOT NULL AND body IS NOT NULL THEN {digest} END AS digest "
                     f"FROM ({body_sql(sql, table)}) {table}_rows")
    in_place = (f"{sql.eq('seq', 'pos')} AND {sql.eq(sql.text('prev_hash'), 'link')} AND "
                f"(digest IS NULL OR {sql.eq('digest', sql.text('row_hash'))})")
    held = "NULL" if want is None else f"CASE WHEN {sql.eq('seq', str(int(want)))} THEN row_hash END"
    window = (f"{sql.fn}row_number() OVER w AS pos, {sql.fn}lag(row_hash, 1, {sql.literal(GENESIS)}) OVER w AS link, "
              f"{sql.fn}lead(seq) OVER w AS next_seq")
    count, top = sql.fn + "count", sql.fn + "max"
    in_python = ", ".join(f"{count}(*) FILTER (WHERE digest IS NULL AND {sql.eq('t', str(k))})" for k in range(len(TABLES)))
    return (f"WITH chain AS ({' UNION ALL '.join(parts)}), "
            f"placed AS (SELECT seq, t, prev_hash, row_hash, recorded_at, digest, {window} "
            f"FROM chain WINDOW w AS (ORDER BY seq, t)) "
            f"SELECT {count}(*), {count}(*) FILTER (WHERE ({in_place}) IS NOT TRUE), "
            f"{top}(CASE WHEN next_seq IS NULL THEN row_hash END), "
            f"{top}(CASE WHEN next_seq IS NULL THEN recorded_at END), {top}({held}), {in_python} FROM placed")


def in_db_python_rows_sql(sql: DuckDBSql, table: str) -> str:
    """The rows of `table` whose SQL body is NULL, as (seq, prev_hash, row_hash, recorded_at,
    payload values in TABLES order): Python hashes those."""
    columns = (*CHAIN_COLUMNS, *(n for n, _ in TABLES[table]))
    return f"SELECT {', '.join(columns)} FROM {table} WHERE ({_sql_body_exact(sql, table)}) IS NOT TRUE"


def in_db_report(fetch: Callable[[str], list[tuple]], sql: DuckDBSql, expect: Head | None) -> VerifyReport | None:
    """The report of a chain re-hashed by its store (`fetch(query)`: the rows, read on one state of
    the ledger), the rows whose SQL body is NULL hashed here; None when anything is out of place,
    for the caller to verify in Python, which names every problem. Only for a store whose
    functions, schemas and tables are the code's (the caller checks that first)."""
    want = expect.seq if expect is not None else None
    count, out_of_place, last_hash, last_at, held, *in_python = fetch(in_db_chain_sql(sql, want))[0]
    if out_of_place:
        return None
    for table, expected in zip(TABLES, in_python):
        if not expected:
            continue
        body, rehashed = FAST_BODIES[table], 0
        for seq, prev_hash, digest, recorded_at, *values in fetch(in_db_python_rows_sql(sql, table)):
            try:
                recomputed = hashlib.sha256(f"{prev_hash}\n{body(seq, recorded_at, values)}".encode()).hexdigest()
            except Exception:  # noqa: BLE001 - the Python path says what it makes of that row
                return None
            if recomputed != digest:
                return None
            rehashed += 1
        if rehashed != expected:
            return None
    seg = ChainSegment(start=1, count=count, problems=[])
    if count:  # every row in place: the first is seq 1, linked to genesis
        seg.first, seg.last_hash, seg.last_at, seg.held = (1, "", GENESIS), last_hash, last_at, held
    return join_segments([seg], expect)
