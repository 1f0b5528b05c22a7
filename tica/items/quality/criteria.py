"""Quality's frozen criteria: the threshold in percentage points, the problem count, greedy
decoding, the confounders quantified elsewhere and the reviewed statistical basis that makes the
threshold decidable. A question's hash is over its canonical JSON
(tica.question.Question.canonical_json): a field added here changes the hash of every quality
question unless canonical_json leaves its default out."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tica.evidence import EvidenceItem
from tica.stats.bases import QualityBasis
from tica.strict import Strict


class QualityCriteria(Strict):
    item: Literal[EvidenceItem.QUALITY] = EvidenceItem.QUALITY
    threshold_points: float = Field(..., ge=0, description="max |score_BI1 - score_BI0| in percentage points")
    expected_problems: int | None = Field(None, ge=1)
    greedy: bool = True
    quantified_confounders: dict[str, str] = Field(
        default_factory=dict, description="arm differences (dotted receipt keys) aligned or quantified elsewhere: key -> where"
    )
    statistical_basis: QualityBasis | None = Field(
        None, description="the reviewed basis that makes the threshold decidable (tica plan quality); null: the "
                          "frozen rule alone")

    @model_validator(mode="after")
    def _basis_fits(self) -> "QualityCriteria":
        basis = self.statistical_basis
        if basis is None:
            return self
        if self.expected_problems is not None and self.expected_problems != basis.problems:
            raise ValueError(f"statistical_basis.problems {basis.problems} is not expected_problems "
                             f"{self.expected_problems}: the basis was planned for another number of problems")
        if basis.min_detectable_difference > self.threshold_points:
            raise ValueError(f"statistical_basis.min_detectable_difference {basis.min_detectable_difference:g} points "
                             f"is wider than the threshold {self.threshold_points:g}: the design would be sized for a "
                             "difference on the other side of zero")
        return self
