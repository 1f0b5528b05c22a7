"""Every criterion ships a canary that must come back fail (or inconclusive where that is the
rule); a criterion whose canary passes is reported broken."""

from __future__ import annotations

from tica.canaries import CANARIES, broken, run_canaries
from tica.evidence import EvidenceItem
from tica.judges import judge_criteria
from tica.judges.recipe_identity import RecipeIdentityResult
from tica.verdict import Verdict

from .conftest import question


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

    results = run_canaries(workdir=tmp_path, judge_fn=lenient, only=["forward.", "clean_exit."])
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

    results = run_canaries(workdir=tmp_path, judge_fn=never_passes, only=["forward."])
    assert results and all(r.broken and r.got == "baseline inconclusive" for r in results)


def test_canaries_follow_the_questions_parameters(tmp_path):
    q = question("forward", min_steps=8, bi0_reference_mean=0.025)
    results = run_canaries({EvidenceItem.FORWARD: q}, workdir=tmp_path, only=["forward."])
    assert broken(results) == []


def test_a_criterion_the_question_switches_off_has_no_applicable_canary_but_the_rest_still_run():
    results = run_canaries(questions={EvidenceItem.FORWARD: question("forward", bi0_reference_mean=None)},
                           only=["forward."])
    off = [r for r in results if r.not_applicable]
    assert [r.name for r in off] == ["forward.bi0_magnitude"] and not off[0].broken
    assert all(not r.broken for r in results) and len(results) - len(off) >= 5


def test_a_report_only_throughput_question_marks_its_canaries_not_applicable():
    results = run_canaries(questions={EvidenceItem.THROUGHPUT: question("throughput", budget=None, formula=None)},
                           only=["throughput."])
    assert results and all(r.not_applicable and not r.broken for r in results)
