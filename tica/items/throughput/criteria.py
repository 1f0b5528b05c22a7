"""Throughput's frozen criteria: the fixed-length workload (lengths, EOS, concurrencies, requests,
warm-ups), the frozen formula and its budget per concurrency, the tier ratio, the metric, arm A of
the crossed pairing order, the token slack, the confounders quantified elsewhere, the reviewed
statistical basis and the workload fields a leg must record. A question's hash is over its
canonical JSON (tica.question.Question.canonical_json): a field added here changes the hash of
every throughput question unless canonical_json leaves its default out (it does for
`statistical_basis` and for `required_workload` listing every field). The freeze-time refusal of
an undecidable budget (tica.question.undecidable) reads the formula named here."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import Field, model_validator

from tica.evidence import EvidenceItem
from tica.pairing import Arm
from tica.stats.bases import THROUGHPUT_TESTS, ThroughputBasis
from tica.strict import Strict as _Strict


class ThroughputFormula(str, Enum):
    """The two statistics of the practice. They are not equivalent and never swapped."""

    MEDIAN_PER_ROUND_PAIRED_LOSS = "median_per_round_paired_loss"  # median_r(1 - T1/T0)
    RATIO_OF_MEDIAN_THROUGHPUTS = "ratio_of_median_throughputs"  # 1 - median_r(T1)/median_r(T0)


FORMULA_LABELS: dict[ThroughputFormula, str] = {
    ThroughputFormula.MEDIAN_PER_ROUND_PAIRED_LOSS: "median per-round paired loss: median_r(1 - T_BI1[c,r] / T_BI0[c,r])",
    ThroughputFormula.RATIO_OF_MEDIAN_THROUGHPUTS: "ratio of median throughputs: 1 - median_r(T_BI1[c,r]) / median_r(T_BI0[c,r])",
}


# The throughput workload fields a leg's receipts state (resolved_config, else the bench JSON).
WorkloadField = Literal["num_warmups", "input_len", "output_len", "ignore_eos", "num_prompts"]
WORKLOAD_FIELDS: tuple[WorkloadField, ...] = ("num_warmups", "input_len", "output_len", "ignore_eos", "num_prompts")


class ThroughputCriteria(_Strict):
    item: Literal[EvidenceItem.THROUGHPUT] = EvidenceItem.THROUGHPUT
    input_len: int = Field(8192, ge=1)
    output_len: int = Field(1024, ge=1)
    ignore_eos: bool = True
    concurrencies: tuple[int, ...] = (1, 8, 32, 64)
    num_prompts: dict[int, int] | None = None
    warmups: int = Field(1, ge=0)
    formula: ThroughputFormula | None = None
    budget: dict[int, float] | None = Field(None, description="max BI=1 loss per concurrency, e.g. {32: 0.10}")
    tier_ratio: float = Field(1.15, gt=1, description="max/min throughput within an arm above this = fast/slow tiers")
    throughput_metric: Literal["output_throughput", "total_token_throughput", "request_throughput"] = "output_throughput"
    arm_a: Arm = Field("bi1", description="the arm called A in pairing_order (AB = A in slot 1)")
    token_tolerance: float = Field(0.0, ge=0, le=0.05, description="relative slack on total input/output tokens")
    quantified_confounders: dict[str, str] = Field(
        default_factory=dict, description="arm differences (dotted receipt keys) aligned or quantified elsewhere: key -> where"
    )
    statistical_basis: ThroughputBasis | None = Field(
        None, description="the reviewed basis that makes each budget decidable (tica plan throughput); null: the "
                          "measured values are reported against the budget")
    required_workload: tuple[WorkloadField, ...] = Field(
        WORKLOAD_FIELDS, description="workload fields a leg must record: one not recorded (unknown) makes its target "
                                     "concurrency inconclusive; one left out here is listed as unknown and judged "
                                     "without. A recorded value that differs from the workload invalidates the leg")

    @model_validator(mode="after")
    def _basis_fits(self) -> "ThroughputCriteria":
        basis = self.statistical_basis
        if basis is None:
            return self
        if not self.budget or self.formula is None:
            raise ValueError("a statistical basis without a formula and a budget decides nothing")
        decides = THROUGHPUT_TESTS.get(basis.test)
        if decides is not None and decides != self.formula.value:
            raise ValueError(f"statistical_basis.test {basis.test!r} decides the {decides} formula, not the frozen "
                             f"{self.formula.value}: the test and the statistic are never mixed")
        stray = sorted(set(basis.min_detectable_difference) - set(self.budget))
        if stray:
            raise ValueError(f"statistical_basis.min_detectable_difference names concurrencies {stray} without a budget")
        return self

    @model_validator(mode="after")
    def _budget_needs_formula(self) -> "ThroughputCriteria":
        if self.budget and self.formula is None:
            raise ValueError("a budget without a formula cannot be judged: set criteria.formula")
        if self.budget:
            unknown = sorted(set(self.budget) - set(self.concurrencies))
            if unknown:
                raise ValueError(f"budget names concurrencies {unknown} that are not in concurrencies")
        if len(set(self.required_workload)) != len(self.required_workload):
            raise ValueError(f"required_workload {list(self.required_workload)} names a field twice")
        if self.num_prompts:
            missing = sorted(set(self.concurrencies) - set(self.num_prompts))
            if missing:
                raise ValueError(f"num_prompts lacks concurrencies {missing}")
        return self
