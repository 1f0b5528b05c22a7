"""The artifacts' frozen criteria: whether every leg must name its weights by a content hash. A
question's hash is over its canonical JSON (tica.question.Question.canonical_json): a field added
here changes the hash of every artifacts question unless canonical_json leaves its default out."""

from __future__ import annotations

from typing import Literal

from tica.evidence import EvidenceItem
from tica.strict import Strict


class ArtifactsCriteria(Strict):
    item: Literal[EvidenceItem.ARTIFACTS] = EvidenceItem.ARTIFACTS
    require_weights_hash: bool = True
