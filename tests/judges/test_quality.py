"""Quality pairing: the six contract items match, the 2x2 sums to N, the difference is judged
against the threshold, a threshold finer than one problem under greedy is flagged."""

from __future__ import annotations

import pytest

from tica.canaries import contract_item, edit_json, edit_jsonl, edit_meta
from tica.judges import judge_criteria
from tica.verdict import Verdict

from .conftest import leg, question

Q = question("quality")


def test_paired_quality_within_threshold_passes(receipts):
    cell = judge_criteria("quality", Q, receipts("quality"))
    assert cell.verdict is Verdict.PASS, cell.reasons
    n = cell.numbers
    assert n["both_correct"] + n["only_bi0"] + n["only_bi1"] + n["both_wrong"] == n["n"] == 30
    assert n["only_bi0"] == 1 and n["only_bi1"] == 1 and n["abs_diff_points"] == 0
    assert "pairing (2x2)" in cell.tables and "scores" in cell.tables


@pytest.mark.parametrize("name,key,value,item", [
    ("dataset", "dataset_version", "openai/gsm8k@main:train[:30]", "dataset version"),
    ("template", "prompt_template", "qwen3-chat-v2 sha256:0001", "prompt/chat template and thinking mode"),
    ("thinking", "thinking_mode", "on", "prompt/chat template and thinking mode"),
    ("sampling", "sampling.stop", ["</answer>"], "sampling parameters"),
    ("repeats", "repeats", 8, "number of repeats"),
    ("scorer", "scorer", "verl.gsm8k/2", "scorer"),
    ("length_cap", "length_cap", 8192, "length cap"),
])
def test_a_contract_item_that_differs_is_inconclusive_naming_it(receipts, name, key, value, item):
    legs = receipts("quality")
    contract_item(key, value)(Q, legs)
    cell = judge_criteria("quality", Q, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert cell.numbers["contract_differs"] == [item]
    assert f"differs in {item}" in cell.reasons[0]


def test_identical_contracts_differ_in_nothing(receipts):
    cell = judge_criteria("quality", Q, receipts("quality"))
    assert cell.numbers["contract_differs"] == []


def test_a_problem_missing_from_one_arm_breaks_the_pairing(receipts):
    legs = receipts("quality")
    p = leg(legs, "bi1")
    edit_jsonl(p / "results.jsonl", lambda rows: rows[1:], p)
    cell = judge_criteria("quality", Q, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any("= 29, not N = 30" in r for r in cell.reasons)


def test_the_same_problem_set_smaller_than_the_question_fixes_is_inconclusive(receipts):
    legs = receipts("quality")
    for arm in ("bi1", "bi0"):
        p = leg(legs, arm)
        edit_jsonl(p / "results.jsonl", lambda rows: rows[:-1], p)
    assert judge_criteria("quality", Q, legs).verdict is Verdict.INCONCLUSIVE
    # 29 problems resolve 3.45 points: the default 3.34-point threshold cannot be shown met on them
    assert judge_criteria("quality", question("quality", expected_problems=29), legs).verdict is Verdict.INCONCLUSIVE
    assert judge_criteria("quality", question("quality", expected_problems=29, threshold_points=3.45),
                          legs).verdict is Verdict.PASS


def test_a_threshold_finer_than_one_problem_is_not_shown_met_by_equal_scores(receipts):
    """Greedy scores move in steps of 100/N points: a threshold finer than that is met only by two
    scores that happen to be equal, which shows nothing about a difference below one problem."""
    legs = receipts("quality")
    finer = question("quality", threshold_points=1.0)
    cell = judge_criteria("quality", finer, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE and any("finer than one problem" in r for r in cell.reasons)
    assert judge_criteria("quality", question("quality", threshold_points=3.34), legs).verdict is Verdict.PASS


def test_a_retried_problem_is_inconclusive(receipts):
    legs = receipts("quality")
    p = leg(legs, "bi0")
    edit_jsonl(p / "results.jsonl", lambda rows: [*rows, dict(rows[3], correct=True)], p)
    assert judge_criteria("quality", Q, legs).verdict is Verdict.INCONCLUSIVE


def test_same_id_different_prompt_is_not_the_same_problem(receipts):
    legs = receipts("quality")
    p = leg(legs, "bi0")
    edit_jsonl(p / "results.jsonl", lambda rows: rows[0].update(prompt_hash="sha256:" + "f" * 64), p)
    assert judge_criteria("quality", Q, legs).verdict is Verdict.INCONCLUSIVE


def _flip_bi1(legs, k):
    p = leg(legs, "bi1")

    def f(rows):
        done = 0
        for r in rows:
            if r["correct"] and done < k:
                r["correct"], done = False, done + 1
    edit_jsonl(p / "results.jsonl", f, p)


def test_a_difference_over_the_threshold_fails(receipts):
    legs = receipts("quality")
    _flip_bi1(legs, 2)  # only_bi0 - only_bi1 = 2 problems = 6.67 points
    cell = judge_criteria("quality", Q, legs)
    assert cell.verdict is Verdict.FAIL
    assert cell.numbers["abs_diff_points"] == pytest.approx(200 / 30)


def test_a_difference_of_one_problem_is_within_a_one_problem_threshold(receipts):
    legs = receipts("quality")
    _flip_bi1(legs, 1)
    cell = judge_criteria("quality", Q, legs)
    assert cell.verdict is Verdict.PASS and cell.numbers["abs_diff_points"] == pytest.approx(100 / 30)


def test_a_threshold_finer_than_one_problem_is_flagged_under_greedy(receipts):
    cell = judge_criteria("quality", question("quality", threshold_points=2.0), receipts("quality"))
    assert cell.numbers["threshold_finer_than_one_problem"] is True
    assert any("finer than one problem" in r for r in cell.reasons)


def test_a_threshold_of_one_problem_is_not_flagged(receipts):
    cell = judge_criteria("quality", Q, receipts("quality"))
    assert cell.numbers["threshold_finer_than_one_problem"] is False
    assert cell.numbers["one_problem_points"] == pytest.approx(100 / 30)


def test_truncation_ratio_is_reported_beside_accuracy(receipts):
    cell = judge_criteria("quality", Q, receipts("quality"))
    assert cell.numbers["truncation_ratio_bi1"] == pytest.approx(1 / 30)
    assert "truncation ratio" in cell.tables["scores"]


def test_a_greedy_question_over_a_sampled_contract_is_inconclusive(receipts):
    legs = receipts("quality")
    for arm in ("bi1", "bi0"):
        p = leg(legs, arm)
        edit_json(p / "contract.json", lambda d: d["sampling"].update(temperature=0.6), p)
    cell = judge_criteria("quality", Q, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE and any("greedy" in r for r in cell.reasons)
    assert judge_criteria("quality", question("quality", greedy=False), legs).verdict is Verdict.PASS


def test_an_unquantified_confounder_blocks_the_attribution(receipts):
    legs = receipts("quality")
    edit_meta(leg(legs, "bi0"), lambda m: m["resolved_config"].update(enable_prefix_caching=True))
    cell = judge_criteria("quality", Q, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE and "enable_prefix_caching" in cell.reasons[0]
    quantified = question("quality", quantified_confounders={
        "resolved_config.enable_prefix_caching": "R3 forces PC on; PC on/off measured equal in run 2026-11-20"})
    assert judge_criteria("quality", quantified, legs).verdict is Verdict.PASS


def test_no_quality_leg_at_all_is_not_run_and_one_arm_alone_is_inconclusive(receipts):
    assert judge_criteria("quality", Q, []).verdict is Verdict.NOT_RUN
    legs = receipts("quality")
    assert judge_criteria("quality", Q, [leg(legs, "bi1")]).verdict is Verdict.INCONCLUSIVE


def test_an_arm_whose_leg_did_not_run_makes_the_pairing_not_run(receipts):
    legs = receipts("quality")
    edit_meta(leg(legs, "bi1"), lambda m: m.update(not_run_reason="vLLM: batch invariance unsupported on cpu"))
    cell = judge_criteria("quality", Q, legs)
    assert cell.verdict is Verdict.NOT_RUN and "no bi1 leg ran" in cell.summary


def test_a_difference_inside_the_noise_floor_is_reported_as_such(receipts):
    from .conftest import with_question

    legs = receipts("quality")
    p = leg(legs, "bi1")
    edit_jsonl(p / "results.jsonl", lambda rows: next(r for r in rows if r["correct"]).update(correct=False), p)
    q = with_question(question("quality", threshold_points=5.0), noise_floor=4.0)  # 1 problem of 30: 3.33 points
    cell = judge_criteria("quality", q, legs)
    assert cell.verdict is Verdict.PASS and cell.numbers["inside_noise_floor"] is True
    assert "inside the noise floor 4" in cell.summary
    # control: the same difference with no noise floor is not said to be noise
    cell = judge_criteria("quality", question("quality", threshold_points=5.0), legs)
    assert cell.numbers["inside_noise_floor"] is False and "noise" not in cell.summary
