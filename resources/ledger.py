"""The ledger as a Dagster resource.

Writers go through `tica.ledger.Ledger`, which holds an exclusive file lock around one short
DuckDB transaction; inside Dagster runs the ops that write are also in pools of one (`ledger`,
`gpu`; limits in dagster.yaml), so writers queue in Dagster before they queue on the lock.
Readers open the file read-only. Unlike `DuckDBResource`, nothing here opens DuckDB read-write
for a read.
"""

from __future__ import annotations

from dagster import ConfigurableResource
from pydantic import Field

from tica.ledger import Ledger, PostgresLedger, open_ledger


class LedgerResource(ConfigurableResource):
    """The ledger (TICA_LEDGER): a DuckDB file, or a Postgres database for many nodes."""

    path: str = Field(description="DuckDB file of the append-only ledger, or a postgresql:// address")
    lock_timeout_s: float = 120.0

    def ledger(self) -> "Ledger | PostgresLedger":
        """The ledger at `path`, created there when it is not there yet."""
        return open_ledger(self.path, lock_timeout_s=self.lock_timeout_s, create=True)
