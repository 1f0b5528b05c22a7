"""Questions as the judges read them: a pass line that cannot be separated from the noise floor
is refused when the question is parsed; the fields every leg must record are frozen with the
question (per-item defaults filled in before hashing); a forward question names the arms it
judges."""

from __future__ import annotations

import pytest

from tica.errors import QuestionError
from tica.evidence import EvidenceItem
from tica.question import DEFAULT_MUST_RECORD

from .conftest import question, with_question


@pytest.mark.parametrize("item,criteria,noise,what", [
    ("throughput", {}, 0.10, "budget at c=1 0.1"),
    ("throughput", {"budget": {1: 0.2, 8: 0.04, 32: 0.2, 64: 0.2}}, 0.05, "budget at c=8 0.04"),
    ("quality", {"threshold_points": 3.34}, 3.34, "threshold_points 3.34"),
    ("forward", {"bi0_reference_mean": 0.01}, 0.02, "bi0_reference_mean 0.01"),
])
def test_a_pass_line_inside_the_noise_floor_is_refused(item, criteria, noise, what):
    q = question(item, **criteria)
    with pytest.raises(QuestionError, match="inside the noise floor") as err:
        with_question(q, noise_floor=noise)
    assert what in str(err.value)


@pytest.mark.parametrize("item,criteria,noise", [
    ("throughput", {}, 0.05),  # budgets 0.10 / 0.15
    ("quality", {"threshold_points": 3.34}, 3.0),
    ("forward", {"bi0_reference_mean": 0.01}, 0.005),
    ("throughput", {"budget": None, "formula": None}, 0.5),  # report-only: no pass line to separate
])
def test_a_pass_line_above_the_noise_floor_is_accepted(item, criteria, noise):
    assert with_question(question(item, **criteria), noise_floor=noise).noise_floor == noise


def test_must_record_defaults_per_item_and_is_part_of_the_hash():
    q = question("forward")
    assert q.must_record == DEFAULT_MUST_RECORD[EvidenceItem.FORWARD] and "versions.vllm" in q.must_record
    assert question("clean_exit").must_record == ()
    assert with_question(q, must_record=["device.name"]).hash != q.hash


def test_must_record_names_leg_json_keys_only():
    with pytest.raises(QuestionError, match="not a dotted leg.json key"):
        with_question(question("quality"), must_record=["vesrions.vllm"])
    with pytest.raises(QuestionError, match="not a dotted leg.json key"):
        with_question(question("quality"), must_record=["versions..vllm"])
    assert with_question(question("quality"), must_record=["image_digest", "source.commit"]).must_record


def test_forward_arms_default_to_both_and_a_bi0_smoke_question_needs_a_reference():
    assert question("forward").criteria.arms == ("bi1", "bi0")
    assert question("forward", arms=["bi0"]).criteria.bi0_smoke
    with pytest.raises(QuestionError, match="needs bi0_reference_mean"):
        question("forward", arms=["bi0"], bi0_reference_mean=None)
    with pytest.raises(QuestionError, match="names an arm twice"):
        question("forward", arms=["bi1", "bi1"])
    with pytest.raises(QuestionError):
        question("forward", arms=[])
