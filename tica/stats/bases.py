"""The frozen statistical bases (pydantic models) and the names of the tests they may freeze.

Questions embed these; parsing a question imports no scipy (the tests live in `throughput` and
`quality`). A test name is any string here so that a basis naming a test this TICA does not
know still parses, and the judge can refuse it (inconclusive, never pass).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Verdicts a decision can reach; the judges turn them into findings.
PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"

SIGN_TEST_MEDIAN = "sign_test_median"
# throughput test name -> the frozen formula (ThroughputFormula value) it decides
THROUGHPUT_TESTS: dict[str, str] = {SIGN_TEST_MEDIAN: "median_per_round_paired_loss"}
EXACT_MCNEMAR_EQUIVALENCE = "exact_mcnemar_equivalence"
QUALITY_TESTS = (EXACT_MCNEMAR_EQUIVALENCE,)


def min_rounds(alpha: float) -> int:
    """The fewest rounds with which the sign test can pass at all (0.5^n <= alpha)."""
    return max(1, math.ceil(math.log(alpha) / math.log(0.5) - 1e-12))


class StrictBasis(BaseModel):
    # A NaN alpha would make every comparison false and an infinite bound never decide: finite only.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    test: str = Field(..., min_length=1, description="the frozen test, by name; a judge refuses a name it does not know")
    # alpha >= 0.5 would let a coin toss pass; 0 can never pass.
    alpha: float = Field(..., gt=0, lt=0.5, description="the largest false-pass rate the basis accepts (one-sided)")
    power: float = Field(0.8, gt=0, lt=1, description="the chance of a pass the plan was sized for, at the minimum "
                                                      "detectable difference inside the pass line")
    pilot_digests: tuple[str, ...] = Field(..., min_length=1, description="sealed digests of the pilot legs the plan read")
    notes: tuple[str, ...] = Field((), description="what the plan said about its pilot, for the reviewer")


class ThroughputBasis(StrictBasis):
    """The reviewed statistical basis of a throughput budget (frozen in the question)."""

    rounds: int = Field(..., ge=2, description="valid crossed rounds per concurrency the decision needs")
    min_detectable_difference: dict[int, float] = Field(
        default_factory=dict,
        description="per target c: how far under the budget the true loss must sit for the design to pass with "
                    "`power` (loss units)")

    @model_validator(mode="after")
    def _decidable(self) -> "ThroughputBasis":
        for c, mdd in self.min_detectable_difference.items():
            if not 0 < mdd <= 1:
                raise ValueError(f"min_detectable_difference at c={c} is {mdd:g}: a loss margin in (0, 1]")
        if self.test == SIGN_TEST_MEDIAN and self.rounds < min_rounds(self.alpha):
            raise ValueError(f"the sign test at alpha {self.alpha:g} can never pass with {self.rounds} rounds "
                             f"(it needs at least {min_rounds(self.alpha)}: 0.5^n <= alpha)")
        return self


class QualityBasis(StrictBasis):
    """The reviewed statistical basis of a quality threshold (frozen in the question)."""

    problems: int = Field(..., ge=2, description="paired problems (one outcome per arm each) the decision needs")
    repeats: int = Field(1, ge=1, description="samples per problem and arm the plan counted (sampled decoding)")
    min_detectable_difference: float = Field(
        ..., gt=0, description="how far inside the threshold (points) the true |difference| must sit for the "
                               "design to pass with `power`")

    @model_validator(mode="after")
    def _margin(self) -> "QualityBasis":
        if self.min_detectable_difference > 100:
            raise ValueError(f"min_detectable_difference {self.min_detectable_difference:g} points is over 100")
        return self
