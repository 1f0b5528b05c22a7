"""A statistical basis in a question: what parses, what is refused, and what it does to the hash."""

from __future__ import annotations

from pathlib import Path

import pytest

from tica.errors import QuestionError
from tica.question import load_question, parse_question

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32

# Hashes of committed questions as they were before the field existed (git 3074fcb).
COMMITTED = {
    "demo/questions/h200-mid4/throughput.yaml": "sha256:e5d8900f0cebdd61bc4a8ab9a3aadb2619d465fe202cfa680c0caf303ec96de2",
    "demo/questions/h200-mid4/quality.yaml": "sha256:1e881ea0c48bde685ff5c7880ff361f478cfe639d26de81a55ce0d4437f1f1d8",
    "tests/fixtures/receipts/questions/throughput.yaml":
        "sha256:9d4e23c33d6fcfcea7db926b1439cb80a2a41fb77dd93a22321eb25a1bafbd0f",
    "tests/fixtures/receipts/questions/quality.yaml":
        "sha256:7698bb54deb485692454aa7fe77fab45fbd4da23c9aa38fbf921866a79bcce09",
}


@pytest.mark.parametrize("path,digest", sorted(COMMITTED.items()))
def test_a_question_without_a_basis_keeps_its_committed_hash(path, digest):
    assert load_question(ROOT / path).hash == digest


def _throughput(**basis_over) -> dict:
    data = load_question(ROOT / "tests/fixtures/receipts/questions/throughput.yaml").model_dump(mode="json")
    data.update(repeats=5, pairing_order=["AB", "BA", "AB", "BA", "AB"])
    data["criteria"]["statistical_basis"] = {"test": "sign_test_median", "alpha": 0.05, "rounds": 5,
                                             "min_detectable_difference": {"8": 0.03}, "pilot_digests": [DIGEST],
                                             **basis_over}
    return data


def _quality(**basis_over) -> dict:
    data = load_question(ROOT / "tests/fixtures/receipts/questions/quality.yaml").model_dump(mode="json")
    data["criteria"]["statistical_basis"] = {"test": "exact_mcnemar_equivalence", "alpha": 0.05, "problems": 30,
                                             "min_detectable_difference": 3.0, "pilot_digests": [DIGEST],
                                             **basis_over}
    return data


def test_a_basis_parses_and_is_part_of_the_hash():
    with_basis = parse_question(_throughput())
    assert with_basis.criteria.statistical_basis.rounds == 5
    data = _throughput()
    data["criteria"]["statistical_basis"] = None
    assert parse_question(data).hash != with_basis.hash
    assert parse_question(_throughput(alpha=0.04)).hash != with_basis.hash
    assert parse_question(_quality()).criteria.statistical_basis.problems == 30


@pytest.mark.parametrize("over,field", [
    ({"alpha": 0.5}, "criteria.throughput.statistical_basis.alpha"),
    ({"alpha": 0.0}, "criteria.throughput.statistical_basis.alpha"),
    ({"alpha": -0.1}, "criteria.throughput.statistical_basis.alpha"),
    ({"rounds": 1}, "criteria.throughput.statistical_basis.rounds"),
    ({"alpha": float("nan")}, "criteria.throughput.statistical_basis.alpha"),
    ({"pilot_digests": []}, "criteria.throughput.statistical_basis.pilot_digests"),
    ({"surprise": 1}, "criteria.throughput.statistical_basis.surprise"),
])
def test_a_malformed_throughput_basis_is_a_parse_error_naming_the_field(over, field):
    with pytest.raises(QuestionError) as err:
        parse_question(_throughput(**over), "q.yaml")
    assert err.value.field == field and err.value.file == "q.yaml"


@pytest.mark.parametrize("over,field", [
    ({"alpha": 0.6}, "criteria.quality.statistical_basis.alpha"),
    ({"problems": 1}, "criteria.quality.statistical_basis.problems"),
    ({"min_detectable_difference": 0}, "criteria.quality.statistical_basis.min_detectable_difference"),
])
def test_a_malformed_quality_basis_is_a_parse_error_naming_the_field(over, field):
    with pytest.raises(QuestionError) as err:
        parse_question(_quality(**over))
    assert err.value.field == field


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(repeats=3, pairing_order=["AB", "BA", "AB"]), "planned for another number of rounds"),
    (lambda d: d["criteria"]["statistical_basis"].update(rounds=4, test="sign_test_median"), "can never pass"),
    (lambda d: d["criteria"].update(formula="ratio_of_median_throughputs"), "never mixed"),
    (lambda d: d["criteria"].update(budget=None), "decides nothing"),
    (lambda d: d["criteria"]["statistical_basis"].update(min_detectable_difference={"8": 0.03, "2": 0.1}),
     "without a budget"),
])
def test_a_throughput_basis_that_contradicts_its_question_is_refused(mutate, message):
    data = _throughput()
    mutate(data)
    with pytest.raises(QuestionError, match=message):
        parse_question(data)


def test_an_unknown_test_name_parses_so_that_the_judge_can_refuse_it():
    assert parse_question(_throughput(test="bayes_factor")).criteria.statistical_basis.test == "bayes_factor"


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d["criteria"].update(expected_problems=40), "planned for another number of problems"),
    (lambda d: d["criteria"]["statistical_basis"].update(min_detectable_difference=5.0), "wider than the threshold"),
])
def test_a_quality_basis_that_contradicts_its_question_is_refused(mutate, message):
    data = _quality()
    mutate(data)
    with pytest.raises(QuestionError, match=message):
        parse_question(data)
