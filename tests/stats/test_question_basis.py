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


# ------------------------------------------------------------ refused at freeze: a pass line that can never pass


def _freeze(tmp_path, data):
    import yaml

    from tica.ledger import Ledger
    from tica.records import freeze_question

    ledger = Ledger(tmp_path / "l.duckdb").init()
    f = tmp_path / "q.yaml"
    f.write_text(yaml.safe_dump(data))
    before = ledger.query("SELECT count(*) FROM questions")[1]
    with pytest.raises(QuestionError) as err:
        freeze_question(ledger, f)
    assert ledger.query("SELECT count(*) FROM questions")[1] == before
    return err.value


def test_a_budget_on_the_ratio_of_medians_is_refused_at_freeze(tmp_path):
    data = load_question(ROOT / "tests/fixtures/receipts/questions/throughput.yaml").model_dump(mode="json")
    data["criteria"]["formula"] = "ratio_of_median_throughputs"
    assert parse_question(data)  # it parses: a ledger that froze one still reads it
    err = _freeze(tmp_path, data)
    assert err.field == "criteria.formula" and "can never pass" in str(err)


def test_the_ratio_of_medians_without_a_budget_is_a_report_and_freezes(tmp_path):
    from tica.question import undecidable

    data = load_question(ROOT / "tests/fixtures/receipts/questions/throughput.yaml").model_dump(mode="json")
    data["criteria"].update(formula="ratio_of_median_throughputs", budget=None)
    assert undecidable(parse_question(data)) is None


@pytest.mark.parametrize("make", [lambda: _throughput(test="bayes_factor"), lambda: _quality(test="z_test")])
def test_a_basis_naming_a_test_no_judge_knows_is_refused_at_freeze(tmp_path, make):
    err = _freeze(tmp_path, make())
    assert err.field == "criteria.statistical_basis.test" and "can never pass" in str(err)


def test_every_committed_question_can_pass():
    from tica.question import undecidable

    paths = sorted(ROOT.glob("demo/**/questions/**/*.yaml")) + sorted(ROOT.glob("tests/fixtures/**/questions/**/*.yaml"))
    assert paths
    assert [str(p) for p in paths if undecidable(load_question(p))] == []


@pytest.mark.parametrize("formula", ["median_per_round_paired_loss", "ratio_of_median_throughputs"])
@pytest.mark.parametrize("test", ["sign_test_median", "bayes_factor"])
def test_every_budget_form_that_freezes_can_pass_under_its_basis(formula, test):
    """The class relation: a throughput question with a budget either is refused at freeze, or
    rounds far under its budget, as many as its basis asks, pass under that basis."""
    from tica.question import undecidable
    from tica.stats.throughput import PASS, decide

    data = _throughput(test=test)
    data["criteria"]["formula"] = formula
    try:
        q = parse_question(data)
    except QuestionError:
        return  # refused by the model itself: the test and the statistic are never mixed
    if undecidable(q) is not None:
        return
    basis, budget = q.criteria.statistical_basis, q.criteria.budget
    for c, b in budget.items():
        assert decide([b - 0.5] * basis.rounds, b, basis).verdict == PASS, (formula, test, c)
