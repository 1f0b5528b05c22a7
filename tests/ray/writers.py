"""The body of one ledger writer, run as a Ray task on a pinned node (test_ray_ledger_writers)."""

from __future__ import annotations

import time


def append_reruns(dsn: str, writer: int, appends: int) -> dict:
    import ray

    from tica.ledger import PostgresLedger

    ctx = ray.get_runtime_context()
    started = time.time()
    ledger = PostgresLedger(dsn, lock_timeout_s=120)
    for i in range(appends):
        ledger.append("reruns", {"rerun_id": f"w{writer}-{i}", "reason": "concurrent writers on Ray nodes"})
    return {"writer": writer, "node_id": ctx.get_node_id(), "started": started, "ended": time.time(),
            "labels": sorted(r for r in ctx.get_assigned_resources() if r.startswith("tica_node_"))}
