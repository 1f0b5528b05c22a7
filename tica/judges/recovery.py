"""Recovery checker: re-read sealed receipts after a parser change.

Versioned apart from the judges (its own source is in its hash). It re-judges the very receipts
the original cell named (same seals, same question) with today's readers, so it can correct only
the control-plane conclusion: it reads nothing the receipts do not hold, so it cannot fill in a
missing value, an unfinished request or a failed exit, and the original status is kept beside
the new one, never replaced.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tica.judging import JUDGE_VERSION
from tica.question import Question
from tica.verdict import Verdict, VerdictCell

RECOVERY_VERSION = "tica.recovery/1+" + hashlib.sha256(
    Path(__file__).read_bytes() + JUDGE_VERSION.encode()).hexdigest()[:16]


class Recovery(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    recovery_version: str
    original_verdict: Verdict
    original_judge_version: str
    original_failure_kept: bool
    recovered: VerdictCell | None
    control_plane_verdict: Verdict
    refused: str | None = None


def recover(original: VerdictCell, question: Question, leg_paths: Sequence[str | Path]) -> Recovery:
    from tica.judges import judge_criteria

    def refuse(why: str) -> Recovery:
        return Recovery(recovery_version=RECOVERY_VERSION, original_verdict=original.verdict,
                        original_judge_version=original.judge_version,
                        original_failure_kept=original.verdict is not Verdict.PASS, recovered=None,
                        control_plane_verdict=original.verdict, refused=why)

    if question.hash != original.question_hash:
        return refuse("the question differs from the one the cell was judged under: that is a new question")
    if original.judge_version == JUDGE_VERSION:
        return refuse("the judge has not changed since this cell: there is nothing to recover")
    recovered = judge_criteria(original.item, question, leg_paths)
    if original.receipt_hashes and recovered.receipt_hashes != original.receipt_hashes:
        return refuse("the receipts are not the sealed ones the cell was judged on (seal digests differ)")
    return Recovery(recovery_version=RECOVERY_VERSION, original_verdict=original.verdict,
                    original_judge_version=original.judge_version,
                    original_failure_kept=original.verdict is not Verdict.PASS, recovered=recovered,
                    control_plane_verdict=recovered.verdict)
