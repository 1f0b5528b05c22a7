"""Every criterion ships a canary that must come back fail (or inconclusive where that is the
rule); a criterion whose canary passes is reported broken."""

from __future__ import annotations

from dataclasses import replace

from tica.canaries import CANARIES, SWITCHED_OFF, broken, run_canaries, switched_off
from tica.evidence import EvidenceItem
from tica.judges import judge_criteria
from tica.judges.recipe_identity import RecipeIdentityResult
from tica.verdict import Verdict

from .conftest import question, with_question


def test_every_canary_flips_its_criterion(tmp_path):
    results = run_canaries(workdir=tmp_path)
    assert len(results) == len(CANARIES)
    assert broken(results) == [], [(r.name, r.got, r.detail) for r in broken(results)]


def test_every_evidence_item_and_the_recipe_gate_have_canaries():
    covered = {c.item for c in CANARIES}
    assert covered == {*EvidenceItem, None}


def test_a_judge_that_always_passes_has_every_canary_broken(tmp_path):
    def lenient(item, q, paths):
        cell = judge_criteria(item, q, paths)
        return cell.model_copy(update={"verdict": Verdict.PASS})

    results = [r for r in run_canaries(workdir=tmp_path, judge_fn=lenient, only=["forward.", "clean_exit."])
               if not r.not_applicable]
    assert results and all(r.broken and r.got == "pass" for r in results)


def test_a_judge_that_crashes_is_broken_not_passing(tmp_path):
    calls = {"n": 0}

    def crashing(item, q, paths):
        calls["n"] += 1
        if calls["n"] == 1:
            return judge_criteria(item, q, paths)  # the baseline
        raise RuntimeError("parser changed")

    [r] = run_canaries(workdir=tmp_path, judge_fn=crashing, only=["clean_exit.client"])
    assert r.broken and r.got == "error" and "parser changed" in r.detail


def test_a_recipe_checker_that_ignores_changes_is_broken(tmp_path):
    def blind(path):
        return RecipeIdentityResult(verdict=Verdict.PASS, summary="pass")

    results = run_canaries(workdir=tmp_path, recipe_fn=blind, only=["recipe."])
    assert results and all(r.broken for r in results)


def test_a_passing_set_that_does_not_pass_reports_its_canaries_broken(tmp_path):
    # A judge (or question) under which even the passing set is not a pass: no canary can show
    # a flip, so every one is broken. (A criterion the question switches off is another matter: below.)
    def never_passes(item, q, paths):
        cell = judge_criteria(item, q, paths)
        return cell.model_copy(update={"verdict": Verdict.INCONCLUSIVE})

    results = [r for r in run_canaries(workdir=tmp_path, judge_fn=never_passes, only=["forward."])
               if not r.not_applicable]
    assert results and all(r.broken and r.got == "baseline inconclusive" for r in results)


def test_canaries_follow_the_questions_parameters(tmp_path):
    q = question("forward", min_steps=8, bi0_reference_mean=0.025)
    results = run_canaries({EvidenceItem.FORWARD: q}, workdir=tmp_path, only=["forward."])
    assert broken(results) == []


def test_a_criterion_the_question_switches_off_has_no_applicable_canary_but_the_rest_still_run():
    results = run_canaries(questions={EvidenceItem.FORWARD: question("forward", bi0_reference_mean=None)},
                           only=["forward."])
    off = {r.name: r.detail for r in results if r.not_applicable}
    assert set(off) == {"forward.bi0_magnitude", "forward.bi0_grad_norm_recorded"}
    assert "names no BI=0 reference" in off["forward.bi0_magnitude"]
    assert all(not r.broken for r in results) and len(results) - len(off) >= 5


def test_canaries_are_switched_off_by_exact_name_each_with_its_reason():
    assert set(SWITCHED_OFF) <= {c.name for c in CANARIES}
    q = question("throughput", budget=None, formula=None)
    over = next(c for c in CANARIES if c.name == "throughput.target_c_over_budget")
    assert "no concurrency can be over a budget" in switched_off(over, q)
    # a name that merely shares a prefix is not switched off with it
    for name in ("throughput.", "throughput.target_c", "throughput.target_c_over_budget_2"):
        assert switched_off(replace(over, name=name), q) is None


def test_a_report_only_throughput_question_switches_off_only_the_budget_and_the_rest_must_run():
    """A question without budget or formula turns off the budget criterion alone. The workload,
    exit, order, tier, profiling and confounder criteria still run; since the cell can never
    pass, their canaries cannot show a flip and are reported broken (blocking), never hidden."""
    results = run_canaries(questions={EvidenceItem.THROUGHPUT: question("throughput", budget=None, formula=None)},
                           only=["throughput."])
    off = [r for r in results if r.not_applicable]
    assert [r.name for r in off] == ["throughput.target_c_over_budget"] and "no concurrency" in off[0].detail
    ran = [r for r in results if not r.not_applicable]
    assert len(ran) >= 10 and all(r.broken and r.got == "baseline inconclusive" for r in ran)
    assert "no frozen formula and budget" in ran[0].detail


def test_a_bi0_smoke_question_runs_the_bi0_canaries_and_switches_off_the_bi1_ones(tmp_path):
    q = question("forward", arms=["bi0"])
    results = run_canaries({EvidenceItem.FORWARD: q}, workdir=tmp_path, only=["forward."])
    assert broken(results) == [], [(r.name, r.got, r.detail) for r in broken(results)]
    off = {r.name for r in results if r.not_applicable}
    assert off == {"forward.bi1_max_zero", "forward.bi1_mean_zero", "forward.bi1_bitwise_arrays",
                   "forward.route_flip", "forward.placeholder_arrays"}
    ran = {r.name: r.got for r in results if not r.not_applicable}
    assert ran["forward.bi0_grad_norm_recorded"] == "inconclusive" and ran["forward.bi0_grad_norm_finite"] == "fail"
    assert ran["forward.arm_ran"] == "not run"


def test_a_bi1_only_forward_question_switches_off_the_bi0_canaries(tmp_path):
    results = run_canaries({EvidenceItem.FORWARD: question("forward", arms=["bi1"])}, workdir=tmp_path,
                           only=["forward."])
    assert broken(results) == []
    assert {r.name for r in results if r.not_applicable} == {
        "forward.bi0_magnitude", "forward.bi0_grad_norm_finite", "forward.bi0_grad_norm_recorded"}


def test_must_record_canaries_run_wherever_the_question_names_fields(tmp_path):
    qs = {EvidenceItem.CLEAN_EXIT: with_question(question("clean_exit"), must_record=["versions.vllm"]),
          EvidenceItem.ARTIFACTS: with_question(question("artifacts"), must_record=["device.name"])}
    results = run_canaries(qs, workdir=tmp_path, only=["clean_exit.must_record", "artifacts.must_record"])
    assert len(results) == 2 and all(not r.broken and not r.not_applicable and r.got == "inconclusive" for r in results)
    # control: with nothing required, the canary is off with its reason, not broken
    off = run_canaries(workdir=tmp_path, only=["clean_exit.must_record"])
    assert off[0].not_applicable and "must_record is empty" in off[0].detail
