"""The verdict cell: one evidence item of one candidate under one question."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tica.evidence import EvidenceItem


class Verdict(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    NOT_RUN = "not run"


class VerdictCell(BaseModel):
    """What a judge returns: the verdict, why, and the numbers behind it.

    `numbers` holds what a person needs to re-check the verdict (per-step diffs, per-round
    throughputs, pairing counts...). `tables` holds markdown tables for display.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    item: EvidenceItem
    verdict: Verdict
    summary: str
    question_hash: str
    reasons: tuple[str, ...] = ()
    numbers: dict[str, Any] = Field(default_factory=dict)
    tables: dict[str, str] = Field(default_factory=dict)
    receipt_hashes: dict[str, str] = Field(default_factory=dict)
    judge_version: str = ""
    candidate_id: str | None = Field(None, description="the candidate the receipts were bound to; None: bound to none")

    @property
    def passed(self) -> bool:
        return self.verdict is Verdict.PASS
