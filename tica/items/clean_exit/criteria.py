"""Clean exit's frozen criteria: the roles whose exits every arm must record. A question's hash
is over its canonical JSON (tica.question.Question.canonical_json): a field added here changes
the hash of every clean-exit question unless canonical_json leaves its default out."""

from __future__ import annotations

from typing import Literal

from tica.evidence import EvidenceItem
from tica.strict import Strict


class CleanExitCriteria(Strict):
    item: Literal[EvidenceItem.CLEAN_EXIT] = EvidenceItem.CLEAN_EXIT
    required_roles: tuple[str, ...] = ("client", "api_server", "engine_core")
