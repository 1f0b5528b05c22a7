"""The update's frozen criteria: the optimizer, the share of tensors a real step changes, the
post-update forward re-check, the rerun that shows it reproducible, the gradient check's pass line.
A question's hash is over its canonical JSON (tica.question.Question.canonical_json): a field added
here changes the hash of every update question unless canonical_json leaves its default out."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tica.evidence import EvidenceItem
from tica.receipts import GRADCHECK_REL_TOL
from tica.strict import Strict


class UpdateCriteria(Strict):
    item: Literal[EvidenceItem.UPDATE] = EvidenceItem.UPDATE
    optimizer: str = "adamw"
    min_weight_change_fraction: float = Field(0.5, gt=0, le=1, description="share of tensors that must change")
    recheck_forward_bitwise: bool = True
    # The committed H200 update (run4 update_bi1) re-checks 5 steps on the updated weights.
    post_update_steps: int = Field(5, ge=1, description="post-update forward steps that must each be bitwise equal")
    reproduced_on_rerun: bool = Field(False, description=(
        "the update run again from the same weights and batch gives the same grad norm and the same updated "
        "weights hash (the leg's recorded rerun; none recorded is inconclusive)"))
    gradcheck_rel_tol: float = Field(GRADCHECK_REL_TOL, gt=0, le=1, description=(
        "pass line of a recorded gradient check (relative error against float64 autograd); the receipt's own "
        "tolerance is never read"))
