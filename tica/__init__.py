"""TICA's pure core: candidates, fingerprints, questions, judges, receipts, ledger, legs.

Nothing under `tica` imports Dagster; the Dagster layer (`tica_assets`, `resources`, `sensors`)
is a thin skin over it.

For scripts, the functions the `tica` command calls, by name (docs/architecture.md, "Scripting
TICA"); each is imported on first use, so `import tica` stays light:

    ledger = tica.open_ledger("data/ledger.duckdb")
    cell = tica.judge("forward", tica.load_question(Q), tica.expand_receipts([LEGS]), tica.load_candidate(M))
    plan = tica.plan_throughput(question, tica.read_pilot(question, legs), {32: 0.10}, alpha=0.05, power=0.8)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# name -> the module that defines it: thin re-exports, no logic of their own
_FACE = {
    "open_ledger": "tica.ledger",  # a DuckDB file or a postgresql:// address -> the ledger
    "load_question": "tica.question",  # a question YAML -> Question
    "load_candidate": "tica.judges",  # a candidate manifest -> the Candidate receipts are bound to
    "expand_receipts": "tica.judges",  # leg folders, folders of legs, bench JSON files -> leg paths
    "judge": "tica.judges",  # `tica judge`: item, question, leg paths, candidate -> VerdictCell
    "report": "tica.acceptance",  # `tica report`: ledger, track, current candidate -> Report
    "read_pilot": "tica.stats.plan",  # `tica plan throughput`: a pilot's legs under a question
    "plan_throughput": "tica.stats.plan",  # -> ThroughputPlan
    "plan_quality": "tica.stats.plan",  # `tica plan quality` -> QualityPlan
}

__all__ = ["__version__", *_FACE]

if TYPE_CHECKING:
    from tica.acceptance import report
    from tica.judges import expand_receipts, judge, load_candidate
    from tica.ledger import open_ledger
    from tica.question import load_question
    from tica.stats.plan import plan_quality, plan_throughput, read_pilot


def __getattr__(name: str) -> object:
    module = _FACE.get(name)
    if module is None:
        raise AttributeError(f"module 'tica' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_FACE})
