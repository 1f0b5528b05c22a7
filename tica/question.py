"""Questions: frozen criteria for one evidence item.

A question fixes, before the first leg runs, what is compared, how it is computed, the pass
line, the noise floor, repeats, pairing order, the aggregation formula, the budget per
concurrency, how an invalid leg is detected, and which leg.json fields must be recorded. Its
hash is over the canonical JSON of the validated model (defaults filled in), so two files that
say the same thing are the same question, and any change of substance is a new question.

The noise floor is in the unit of the item's pass line: forward, BI=0 mean |probs diff|;
quality, percentage points; throughput, loss 1 - T_BI1/T_BI0. A difference inside it is
reported as such. A pass line at or inside a non-zero noise floor cannot be told from noise, so
such a question is refused when it is parsed. Exact criteria (BI=1 bitwise, backward, update,
exits, artifacts) have no noise floor: they do not read it.

A throughput or quality question may also freeze a reviewed statistical basis (tica.stats.bases,
drafted by `tica plan`): the test, alpha, rounds or problems, the minimum detectable difference
and the pilot's digests; it makes the pass line decidable (docs/statistics.md). Without one a
question hashes exactly as it did before the field existed; so does a throughput question that
requires every workload field (`required_workload`, the default).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Field, ValidationError, model_validator

from tica import pairing
from tica.errors import QuestionError, pydantic_errors, read_file_bytes, yaml_mapping_of
from tica.evidence import EvidenceItem
from tica.items.artifacts.criteria import ArtifactsCriteria
from tica.items.backward.criteria import BackwardCriteria
from tica.items.clean_exit.criteria import CleanExitCriteria
from tica.items.forward.criteria import ForwardCriteria
from tica.items.quality.criteria import QualityCriteria
from tica.items.throughput.criteria import FORMULA_LABELS, WORKLOAD_FIELDS, ThroughputCriteria, ThroughputFormula
from tica.items.update.criteria import UpdateCriteria
from tica.pairing import Arm, Order
from tica.receipts import GRADCHECK_REL_TOL, LegMeta
from tica.stats.bases import QUALITY_TESTS, THROUGHPUT_TESTS
from tica.strict import Strict as _Strict


# What every leg of an item must record (dotted leg.json keys); an unknown one makes the cell
# inconclusive. Exits and artifacts judge what their own criteria name.
_IDENTITY = ("versions.vllm", "versions.torch", "device.name", "kernels", "resolved_config.weights_hash")
DEFAULT_MUST_RECORD: dict[EvidenceItem, tuple[str, ...]] = {
    EvidenceItem.FORWARD: _IDENTITY, EvidenceItem.BACKWARD: _IDENTITY, EvidenceItem.UPDATE: _IDENTITY,
    EvidenceItem.QUALITY: _IDENTITY, EvidenceItem.THROUGHPUT: _IDENTITY,
    EvidenceItem.CLEAN_EXIT: (), EvidenceItem.ARTIFACTS: (),
}


def _leg_json_keys() -> set[str]:
    return {f.alias or name for name, f in LegMeta.model_fields.items()}


Criteria = Annotated[
    Union[
        ForwardCriteria,
        BackwardCriteria,
        UpdateCriteria,
        QualityCriteria,
        ThroughputCriteria,
        CleanExitCriteria,
        ArtifactsCriteria,
    ],
    Field(discriminator="item"),
]


class Question(_Strict):
    """Frozen criteria for one evidence item (docs/practice.md: 'Questions are frozen before the run')."""

    name: str = Field(..., min_length=1)
    item: EvidenceItem
    compared: str = Field(..., min_length=1, description="the compared quantity")
    computation: str = Field(..., min_length=1, description="how it is computed")
    pass_line: str = Field(..., min_length=1)
    noise_floor: float = Field(..., ge=0, description="in the pass line's unit (module docstring); 0: none")
    repeats: int = Field(1, ge=1)
    pairing_order: tuple[Order, ...] = ("AB",)
    invalid_leg_rule: str = Field(..., min_length=1)
    must_record: tuple[str, ...] = Field(
        (), description="dotted leg.json keys every judged leg must record (e.g. versions.vllm); default per item")
    criteria: Criteria

    @model_validator(mode="before")
    @classmethod
    def _default_must_record(cls, data: Any) -> Any:
        # Filled in before hashing, so the hash names the fields actually required.
        if isinstance(data, dict) and "must_record" not in data:
            try:
                item = EvidenceItem(data.get("item"))
            except ValueError:
                return data
            data = {**data, "must_record": DEFAULT_MUST_RECORD[item]}
        return data

    @model_validator(mode="after")
    def _must_record_names_leg_fields(self) -> "Question":
        known = _leg_json_keys()
        for key in self.must_record:
            parts = key.split(".")
            if "" in parts or parts[0] not in known:
                raise ValueError(f"must_record {key!r} is not a dotted leg.json key (top level: {sorted(known)})")
        return self

    def pass_lines(self) -> list[tuple[str, float]]:
        """The numeric pass lines a noise floor applies to, named."""
        c = self.criteria
        if isinstance(c, ThroughputCriteria):
            return [(f"budget at c={k}", v) for k, v in sorted((c.budget or {}).items())]
        if isinstance(c, QualityCriteria):
            return [("threshold_points", c.threshold_points)]
        if isinstance(c, ForwardCriteria) and c.bi0_reference_mean is not None:
            return [("bi0_reference_mean", c.bi0_reference_mean)]
        return []

    @model_validator(mode="after")
    def _pass_line_outside_noise(self) -> "Question":
        if self.noise_floor > 0:
            inside = [f"{name} {v:g}" for name, v in self.pass_lines() if v <= self.noise_floor]
            if inside:
                raise ValueError(f"{', '.join(inside)} is at or inside the noise floor {self.noise_floor:g}: a pass "
                                 "line that cannot be separated from noise cannot yield pass")
        return self

    @model_validator(mode="after")
    def _consistent(self) -> "Question":
        if self.criteria.item != self.item:
            raise ValueError(f"criteria are for {self.criteria.item.value}, question is for {self.item.value}")
        if len(self.pairing_order) != self.repeats and self.item is EvidenceItem.THROUGHPUT:
            raise ValueError(
                f"pairing_order has {len(self.pairing_order)} rounds but repeats is {self.repeats}"
            )
        if self.item is EvidenceItem.THROUGHPUT:
            order = self.pairing_order
            if not pairing.is_crossed(order):
                raise ValueError(f"pairing order {list(order)} is not crossed (AB/BA/AB ...)")
            basis = getattr(self.criteria, "statistical_basis", None)
            if basis is not None and basis.rounds != self.repeats:
                raise ValueError(f"statistical_basis.rounds is {basis.rounds} but repeats is {self.repeats}: the basis "
                                 "was planned for another number of rounds")
        return self

    def canonical_json(self) -> str:
        data = self.model_dump(mode="json")
        # A question without a basis hashes as it did before the field existed.
        if data["criteria"].get("statistical_basis", ...) is None:
            del data["criteria"]["statistical_basis"]
        # Every workload field required (the default) hashes as before the field existed; the
        # order the fields are listed in is no substance.
        if isinstance(data["criteria"].get("required_workload"), list):
            if set(data["criteria"]["required_workload"]) == set(WORKLOAD_FIELDS):
                del data["criteria"]["required_workload"]
            else:
                data["criteria"]["required_workload"] = sorted(data["criteria"]["required_workload"])
        if data["criteria"].get("gradcheck_rel_tol", ...) == GRADCHECK_REL_TOL:
            del data["criteria"]["gradcheck_rel_tol"]
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @property
    def hash(self) -> str:
        return "sha256:" + hashlib.sha256(self.canonical_json().encode()).hexdigest()

    @property
    def arm_a(self) -> Arm:
        """The arm called A in the pairing order (throughput freezes it; every other item: BI=1)."""
        return getattr(self.criteria, "arm_a", "bi1")

    def round_order(self, round_no: int) -> Order:
        return pairing.round_order(self.pairing_order, round_no)  # type: ignore[return-value]

    def round_arms(self, round_no: int) -> tuple[Arm, Arm]:
        """The arms of round r in slot order (tica.pairing, under this question's order and arm A)."""
        return pairing.round_arms(self.pairing_order, self.arm_a, round_no)

    @property
    def formula_label(self) -> str | None:
        c = self.criteria
        if isinstance(c, ThroughputCriteria) and c.formula is not None:
            return FORMULA_LABELS[c.formula]
        return None


def undecidable(question: Question) -> tuple[str, str] | None:
    """(field, reason) when the question sets a pass line no judge here can ever declare passed.
    Such a question still parses (a ledger keeps what it froze, and its cells stay inconclusive),
    but it is refused at freeze time, before anyone runs legs for it."""
    c = question.criteria
    if isinstance(c, ThroughputCriteria) and c.budget and c.formula is ThroughputFormula.RATIO_OF_MEDIAN_THROUGHPUTS:
        return ("criteria.formula", "a budget on the ratio of median throughputs can never pass: no exact test of "
                                    "that statistic is known here; judge the budget on median_per_round_paired_loss, "
                                    "or drop the budget to report the ratio")
    basis = getattr(c, "statistical_basis", None)
    known = THROUGHPUT_TESTS if isinstance(c, ThroughputCriteria) else QUALITY_TESTS
    if basis is not None and basis.test not in known:
        return ("criteria.statistical_basis.test", f"{basis.test!r} is a test no judge here knows, so it can never "
                                                   f"pass; known: {', '.join(sorted(known))}")
    return None


def parse_question(data: Any, source: str | Path = "<memory>") -> Question:
    if not isinstance(data, dict):
        raise QuestionError(source, "<root>", "a question must be a mapping")
    try:
        return Question.model_validate(data)
    except ValidationError as err:
        raise pydantic_errors(QuestionError, source, err) from None


def load_question(path: str | Path) -> Question:
    return _parsed(str(path), read_file_bytes(path, QuestionError))


# Keyed on the bytes read, never on mtime (an edit inside the clock's granularity keeps it): a
# track's materialization looks for its questions hundreds of times and YAML parsing was most of
# that. A Question is frozen, so sharing one is safe; a file that fails is not kept.
@functools.lru_cache(maxsize=256)
def _parsed(path: str, raw: bytes) -> Question:
    return parse_question(yaml_mapping_of(raw, path, QuestionError), path)
