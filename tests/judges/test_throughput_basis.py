"""Throughput under a reviewed statistical basis: pass only when the frozen test's upper bound is
under the budget; the frozen rule's overrun still fails; short rounds or an unknown test never pass."""

from __future__ import annotations

import pytest

from tests.stats.pilots import throughput_question, write_pilot
from tica.canaries import edit_json, tput_leg
from tica.judges import judge_criteria
from tica.question import parse_question
from tica.verdict import Verdict

DIGEST = "sha256:" + "cd" * 32
UNDER = [0.02, 0.05, 0.03, 0.04, 0.06]  # every round under the c=8 budget 0.10


def basis_question(rounds: int = 5, **basis_over):
    data = throughput_question(rounds).model_dump(mode="json")
    data["criteria"]["statistical_basis"] = {"test": "sign_test_median", "alpha": 0.05, "rounds": rounds,
                                             "min_detectable_difference": {"8": 0.05}, "pilot_digests": [DIGEST],
                                             **basis_over}
    return parse_question(data)


@pytest.fixture
def legs(tmp_path):
    def make(losses_c8, rounds=5):
        return write_pilot(throughput_question(rounds), tmp_path / "legs", {8: losses_c8})
    return make


def _decision(cell, c):
    return cell.numbers["per_concurrency"][str(c)]["decision"]


def test_every_round_under_the_budget_passes_with_its_bounds_shown(legs):
    cell = judge_criteria("throughput", basis_question(), legs(UNDER))
    assert cell.verdict is Verdict.PASS, cell.reasons
    d = _decision(cell, 8)
    assert d["decision"] == "pass" and d["upper_bound"] == pytest.approx(0.06) and d["p_value"] == pytest.approx(1 / 32)
    assert "statistical basis (per target c)" in cell.tables and "sign_test_median" in cell.summary
    assert cell.numbers["statistical_basis"]["rounds"] == 5


def test_a_median_under_the_budget_whose_bound_is_not_is_inconclusive_and_says_how_many_rounds_would_decide(legs):
    cell = judge_criteria("throughput", basis_question(), legs([0.02, 0.05, 0.03, 0.04, 0.12]))
    assert cell.verdict is Verdict.INCONCLUSIVE
    reason = next(r for r in cell.reasons if r.startswith("inconclusive: c=8"))
    assert "inside the noise" in reason and "more crossed round(s) would decide at the measured spread" in reason
    assert _decision(cell, 8)["more_rounds"] >= 1


def test_without_a_basis_the_same_legs_are_reported_never_passed(legs):
    """The control of the test above: no basis, the frozen rule's median is under the budget, and
    the practice says to report the measured values and not declare the budget passed."""
    paths = legs([0.02, 0.05, 0.03, 0.04, 0.12])
    cell = judge_criteria("throughput", throughput_question(5), paths)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any(r.startswith("inconclusive: c=8: loss 0.04 ") and "under the budget 0.1, but the question has no "
               "reviewed statistical basis: reported, not passed" in r for r in cell.reasons), cell.reasons
    assert "statistical_basis" not in cell.numbers and "statistical basis (per target c)" not in cell.tables
    assert all("decision" not in e for e in cell.numbers["per_concurrency"].values())
    assert cell.numbers["per_concurrency"]["8"]["over_budget"] is False  # measured and reported


def test_every_round_under_the_budget_without_a_basis_is_inconclusive_and_with_one_passes(legs):
    """The same receipts: no basis is never a pass, whatever the rounds say; the basis decides."""
    paths = legs(UNDER)
    bare = judge_criteria("throughput", throughput_question(5), paths)
    assert bare.verdict is Verdict.INCONCLUSIVE
    missing = [r for r in bare.reasons if "no reviewed statistical basis" in r]
    assert {r.split(":")[1].strip() for r in missing} == {"c=1", "c=8", "c=32", "c=64"}  # every target c
    assert "no statistical basis: measured values only" in bare.summary
    assert judge_criteria("throughput", basis_question(), paths).verdict is Verdict.PASS  # negative control


def test_an_overrun_without_a_basis_still_fails_by_the_frozen_rule(legs):
    cell = judge_criteria("throughput", throughput_question(5), legs([0.09, 0.11, 0.12, 0.13, 0.2]))
    assert cell.verdict is Verdict.FAIL and "c=8" in cell.reasons[0] and "aggregate overrun" in cell.reasons[0]
    assert not any("c=8" in r and "no reviewed statistical basis" in r for r in cell.reasons)


def test_a_median_over_the_budget_fails_by_the_frozen_rule_and_names_its_lower_bound(legs):
    cell = judge_criteria("throughput", basis_question(), legs([0.09, 0.11, 0.12, 0.13, 0.2]))
    assert cell.verdict is Verdict.FAIL and "c=8" in cell.reasons[0]
    assert any("lower bound 0.09 is under the budget: the overrun is inside the noise" in r for r in cell.reasons)


def test_fewer_valid_rounds_than_the_basis_never_pass(legs):
    paths = legs(UNDER)
    p = tput_leg(paths, "bi1", 8, 3)
    edit_json(p / "bench.json", lambda d: d.update(failed=1, completed=d["completed"] - 1), p)
    cell = judge_criteria("throughput", basis_question(), paths)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any("4 valid round(s), the statistical basis needs 5" in r for r in cell.reasons)


def test_an_unknown_test_is_inconclusive_never_a_pass(legs):
    paths = legs(UNDER)
    cell = judge_criteria("throughput", basis_question(test="bootstrap_mean"), paths)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any("'bootstrap_mean', which this TICA does not know" in r for r in cell.reasons)
    assert judge_criteria("throughput", basis_question(), paths).verdict is Verdict.PASS  # control


def test_tiers_keep_a_decided_pass_inconclusive(legs, tmp_path):
    paths = write_pilot(throughput_question(5), tmp_path / "tiers", {8: UNDER}, bi0_factor={8: [1, 1, 0.7, 1, 1]})
    cell = judge_criteria("throughput", basis_question(), paths)
    assert _decision(cell, 8)["decision"] == "pass"
    assert cell.verdict is Verdict.INCONCLUSIVE and any("tiers" in r for r in cell.reasons)


def test_the_decision_code_is_part_of_the_judge_version():
    """A change to the tests' code is a new judge version, like a change to the judges."""
    from tica.judging import judge_sources

    names = {p.as_posix().split("/tica/")[-1] for p in judge_sources()}
    assert {"stats/throughput.py", "stats/quality.py", "stats/bases.py"} <= names
    assert "stats/plan.py" not in names and "stats/plots.py" not in names  # control: planning never judges
