"""Quality's own receipt reading: a quality leg's contract.json, as the judge reads it.

The models stay in the core (tica.receipts: `ProblemResult`, `RecordedEvalContract`, `Sampling`,
`load_quality_results`): ingest writes through them, the manifest reads `Sampling` and the schema
command exports them. What only this room reads lives here.
"""

from __future__ import annotations

from pathlib import Path

from tica.receipts import RecordedEvalContract, load_json, validate_receipt


def load_recorded_contract(path: str | Path) -> RecordedEvalContract | None:
    """A quality leg's contract.json as recorded, items it leaves out unknown; None when the leg
    has no contract.json (the whole contract is unknown). A recorded item that is malformed, or a
    field that is no contract item, is still refused naming the field."""
    path = Path(path)
    if not path.exists():
        return None
    return validate_receipt(RecordedEvalContract, load_json(path), path)
