"""Quality under a reviewed statistical basis: pass only when the exact McNemar bounds of the
difference lie inside the threshold; the frozen rule's overrun still fails; too few problems,
other repeats or an unknown test never pass; the 1/N warning stays."""

from __future__ import annotations

import pytest

from tica.canaries import build_quality, edit_json, edit_jsonl
from tica.judges import judge_criteria
from tica.verdict import Verdict

from .conftest import leg, question

DIGEST = "sha256:" + "ef" * 32


def basis(**over) -> dict:
    return {"test": "exact_mcnemar_equivalence", "alpha": 0.05, "problems": 1000, "min_detectable_difference": 3.0,
            "pilot_digests": [DIGEST], **over}


def q_basis(n: int = 1000, threshold: float = 3.0, expected: int | None = 1000, **over):
    return question("quality", threshold_points=threshold, expected_problems=expected,
                    statistical_basis=basis(problems=n, **over))


@pytest.fixture
def big(tmp_path):
    """1000 paired problems, one discordant each way (the canaries' quality legs, scaled up)."""
    return build_quality(question("quality", expected_problems=1000), tmp_path / "big")


def test_a_large_pairing_inside_the_threshold_passes_with_its_bounds(big):
    cell = judge_criteria("quality", q_basis(), big)
    assert cell.verdict is Verdict.PASS, cell.reasons
    d = cell.numbers["decision"]
    assert d["decision"] == "pass" and -3.0 < d["lower_bound_points"] < 0 < d["upper_bound_points"] < 3.0
    assert "statistical basis" in cell.tables and "exact_mcnemar_equivalence" in cell.summary


def test_thirty_problems_inside_the_threshold_are_inconclusive_under_a_basis(receipts):
    """The committed 30-problem fixture passes its frozen rule (|diff| 0), but 30 problems cannot
    bound a difference within one problem: under a basis it is inconclusive, naming the N to decide."""
    legs = receipts("quality")
    cell = judge_criteria("quality", q_basis(n=30, threshold=3.34, expected=30), legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any("inside the noise" in r and "more paired problems would decide" in r for r in cell.reasons)
    assert judge_criteria("quality", question("quality"), legs).verdict is Verdict.PASS  # control: no basis


def test_over_the_threshold_fails_by_the_frozen_rule_and_gives_the_mcnemar_p(receipts):
    legs = receipts("quality")
    p = leg(legs, "bi1")

    def flip(rows):
        done = 0
        for r in rows:
            if r["correct"] and done < 2:
                r["correct"], done = False, done + 1
    edit_jsonl(p / "results.jsonl", flip, p)
    cell = judge_criteria("quality", q_basis(n=30, threshold=3.34, expected=30), legs)
    assert cell.verdict is Verdict.FAIL
    assert any("McNemar p =" in r and "a fail by the frozen rule all the same" in r for r in cell.reasons)


def test_fewer_problems_than_the_basis_never_pass(big):
    cell = judge_criteria("quality", q_basis(n=2000, expected=None), big)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any("1000 paired problem(s), the statistical basis needs 2000" in r for r in cell.reasons)


def test_an_unknown_test_is_inconclusive_never_a_pass(big):
    cell = judge_criteria("quality", q_basis(test="bayesian_bootstrap"), big)
    assert cell.verdict is Verdict.INCONCLUSIVE and any("does not know" in r for r in cell.reasons)


def test_contracts_with_other_repeats_than_the_basis_never_pass(big):
    for arm in ("bi1", "bi0"):
        p = leg(big, arm)
        edit_json(p / "contract.json", lambda d: d.update(repeats=4), p)
    cell = judge_criteria("quality", q_basis(), big)
    assert cell.verdict is Verdict.INCONCLUSIVE and any("repeats [4, 4]" in r for r in cell.reasons)
    assert judge_criteria("quality", q_basis(repeats=4), big).verdict is Verdict.PASS  # control


def test_the_one_problem_granularity_warning_stays_under_a_basis(receipts):
    cell = judge_criteria("quality", q_basis(n=30, threshold=2.0, expected=30, min_detectable_difference=2.0),
                          receipts("quality"))
    assert cell.numbers["threshold_finer_than_one_problem"] is True
    assert any("finer than one problem" in r for r in cell.reasons)
