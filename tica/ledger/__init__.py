"""The append-only, hash-chained evidence ledger: one chain across all tables, in a DuckDB file or a
Postgres database, behind one store interface (LedgerStore).

Its modules import strictly downwards (pyproject.toml's import-linter contract "the ledger's
modules import downwards only" keeps it so, inside functions too):

    range_worker                       a parallel verify's range, in a process of its own
    transfer | store                   export/import of a whole chain; open_ledger, the one place a target picks a store
    duckdb_store | postgres_store      Ledger (a DuckDB file) and PostgresLedger
    parallel                           verify in seq ranges, each in a process of its own
    batches                            verify a batch of columns at a time
    connect | in_db | locking | rows   opening a store, verify in the database, the writer lock, rows in and out
    interface                          LedgerStore and the errors every store raises
    chain                              row hashing, Head, segments and their report: no database
    schema                             tables, views, indexes and the SQL both stores share

Import the names below from here; a test that patches a module's attribute patches the module that
reads it (tica.ledger.duckdb_store.QUERY_TIMEOUT_S, tica.ledger.batches.postgres_batches, ...).
"""

from __future__ import annotations

from tica.ledger.chain import (FAST_BODIES, GENESIS, ChainSegment, Head, VerifyReport, check_segment, extend_chain,
                               join_segments, merge_chain, row_hash, verify_entries)
from tica.ledger.connect import redacted
from tica.ledger.duckdb_store import Ledger
from tica.ledger.in_db import (IN_DB_ENV, DuckDBSql, body_parts_sql, body_sql, in_db_chain_sql, in_db_enabled,
                               in_db_python_rows_sql, in_db_report)
from tica.ledger.interface import LedgerLockTimeout, LedgerMissing, LedgerStore, QueryRefused
from tica.ledger.postgres_store import PG_VIEWS, PostgresLedger, PostgresSql
from tica.ledger.rows import new_id
from tica.ledger.schema import (CHAIN_COLUMNS, INDEXES, TABLES, TRACK_VERDICTS_SQL, VERIFY_CHUNK_ROWS, VIEWS,
                                dropped_tables, insert_sql)
from tica.ledger.store import default_ledger_path, is_postgres, open_ledger
from tica.ledger.transfer import export_chain, import_chain

__all__ = [
    # the stores, and choosing one
    "Ledger", "PostgresLedger", "LedgerStore", "open_ledger", "is_postgres", "default_ledger_path", "redacted",
    "LedgerLockTimeout", "LedgerMissing", "QueryRefused",
    # the schema
    "CHAIN_COLUMNS", "TABLES", "VIEWS", "PG_VIEWS", "INDEXES", "TRACK_VERDICTS_SQL", "VERIFY_CHUNK_ROWS",
    "dropped_tables", "insert_sql", "new_id",
    # the chain
    "GENESIS", "Head", "VerifyReport", "ChainSegment", "FAST_BODIES", "row_hash", "extend_chain", "merge_chain",
    "check_segment", "join_segments", "verify_entries",
    # verify in the database
    "IN_DB_ENV", "DuckDBSql", "PostgresSql", "in_db_enabled", "in_db_report", "body_sql", "body_parts_sql",
    "in_db_chain_sql", "in_db_python_rows_sql",
    # moving a chain between ledgers
    "export_chain", "import_chain",
]
