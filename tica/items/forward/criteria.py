"""The forward's frozen criteria: the steps that must each be present, the arms judged (BI=1's
bitwise claim, or BI=0 alone: the smoke check), BI=0's reference magnitude, the confounders
aligned or quantified elsewhere. A question's hash is over its canonical JSON
(tica.question.Question.canonical_json): a field added here changes the hash of every forward
question unless canonical_json leaves its default out."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tica.evidence import EvidenceItem
from tica.pairing import Arm
from tica.strict import Strict


class ForwardCriteria(Strict):
    item: Literal[EvidenceItem.FORWARD] = EvidenceItem.FORWARD
    min_steps: int = Field(5, ge=1, description="steps that must each be present and judged")
    arms: tuple[Arm, ...] = Field(
        ("bi1", "bi0"), min_length=1,
        description="arms judged: with bi1, a BI=1 leg must have run (the bitwise claim) and BI=0 legs present are "
                    "judged; [bi0] alone is the BI=0 smoke check (a BI=0 leg must have run, grad norm recorded)")
    # BI=1 passes only with max = mean = 0 at every step: not a parameter, a rule.
    bi0_reference_mean: float | None = Field(
        ..., gt=0, description="independent reference for BI=0 mean |diff|; null: BI=0 is reported, not judged"
    )
    bi0_magnitude_factor: float = Field(10.0, gt=1, description="BI=0 mean within [ref/f, ref*f] is 'same magnitude'")
    quantified_confounders: dict[str, str] = Field(
        default_factory=dict, description="arm differences (dotted receipt keys) aligned or quantified elsewhere: key -> where"
    )

    @model_validator(mode="after")
    def _arms(self) -> "ForwardCriteria":
        if len(set(self.arms)) != len(self.arms):
            raise ValueError(f"arms {list(self.arms)} names an arm twice")
        if self.arms == ("bi0",) and self.bi0_reference_mean is None:
            raise ValueError("a BI=0 smoke question (arms [bi0]) needs bi0_reference_mean: without a reference it cannot pass")
        return self

    @property
    def bi0_smoke(self) -> bool:
        """The question judges BI=0 alone: the practice's BI=0 smoke check."""
        return "bi1" not in self.arms
