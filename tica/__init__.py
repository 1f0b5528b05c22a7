"""TICA's pure core: candidates, fingerprints, questions, judges, receipts, ledger, legs.

Nothing under `tica` imports Dagster; the Dagster layer (`tica_assets`, `resources`, `sensors`)
is a thin skin over it.
"""

__version__ = "0.1.0"
