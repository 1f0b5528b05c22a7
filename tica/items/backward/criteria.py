"""The backward's frozen criteria: the share of parameters a gradient must reach, the forward on
the deployed bytes where weights are quantized, the gradient check's pass line. A question's hash
is over its canonical JSON (tica.question.Question.canonical_json): a field added here changes
the hash of every backward question unless canonical_json leaves its default out."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tica.evidence import EvidenceItem
from tica.receipts import GRADCHECK_REL_TOL
from tica.strict import Strict


class BackwardCriteria(Strict):
    item: Literal[EvidenceItem.BACKWARD] = EvidenceItem.BACKWARD
    min_params_with_grad_fraction: float = Field(1.0, gt=0, le=1)
    require_deployed_bytes_forward: bool = True
    gradcheck_rel_tol: float = Field(GRADCHECK_REL_TOL, gt=0, le=1, description=(
        "pass line of a recorded gradient check (relative error against float64 autograd); the receipt's own "
        "tolerance is never read"))
