"""Unknown is a value: a throughput workload field a leg does not record is listed as unknown, and
it leaves its target concurrency inconclusive only when the question requires it
(`required_workload`); recorded and different still invalidates the leg. Forward steps whose
step_basis / checkpoint_version are unknown leave the BI=1 claim inconclusive, named."""

from __future__ import annotations

import pytest

from tica.canaries import edit_json, edit_meta, edit_jsonl, tput_leg
from tica.judges import judge_criteria
from tica.question import WORKLOAD_FIELDS
from tica.verdict import Verdict

from .conftest import FIXTURE_BASIS, leg, question, throughput_question

Q = throughput_question()  # passes on the committed set; requires every workload field (default)
FIELDS = ("num_warmups", "input_len", "output_len", "ignore_eos")  # num_prompts: vLLM always writes it


def _forget(legs, field, c=32):
    """No leg at c records `field` any more (neither leg.json nor bench.json)."""
    for arm, r in ((a, r) for a in ("bi1", "bi0") for r in (1, 2, 3)):
        p = tput_leg(legs, arm, c, r)
        edit_json(p / "bench.json", lambda d: d.pop(field, None), None)
        edit_meta(p, lambda m: m["resolved_config"].pop(field, None))


def _reasons(cell, verdict):
    tag = "note: " if verdict is Verdict.PASS else f"{verdict.value}: "
    return [r for r in cell.reasons if r.startswith(tag)]


def test_the_default_question_requires_every_workload_field_and_hashes_as_before():
    assert throughput_question().criteria.required_workload == WORKLOAD_FIELDS
    assert "required_workload" not in question("throughput").canonical_json()
    relaxed = throughput_question(required_workload=["input_len", "output_len", "ignore_eos", "num_prompts"])
    assert relaxed.hash != Q.hash and "required_workload" in relaxed.canonical_json()


@pytest.mark.parametrize("field", FIELDS)
def test_a_required_field_not_recorded_leaves_its_concurrency_inconclusive_named(receipts, field):
    legs = receipts("throughput")
    _forget(legs, field)
    cell = judge_criteria("throughput", Q, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE, cell.reasons
    assert any(f"c=32: unknown: {field} (" in r for r in _reasons(cell, Verdict.INCONCLUSIVE)), cell.reasons
    per_c = cell.numbers["per_concurrency"]["32"]
    assert per_c["unknown"]["required"] == [field] and per_c["over_budget"] is None
    assert f"unknown: {field}" in cell.summary


@pytest.mark.parametrize("field", FIELDS)
def test_a_field_the_question_relaxes_is_judged_without_and_still_listed(receipts, field):
    legs = receipts("throughput")
    _forget(legs, field)
    q = throughput_question(required_workload=[f for f in WORKLOAD_FIELDS if f != field])
    cell = judge_criteria("throughput", q, legs)
    assert cell.verdict is Verdict.PASS, cell.reasons
    assert any(f"c=32: unknown: {field} (" in r for r in _reasons(cell, Verdict.PASS))
    assert cell.numbers["per_concurrency"]["32"]["unknown"]["not_required"] == [field]


@pytest.mark.parametrize("field,value", [("num_warmups", 3), ("input_len", 4096), ("output_len", 512),
                                         ("ignore_eos", False)])
def test_recorded_and_different_invalidates_the_leg_even_when_relaxed(receipts, field, value):
    legs = receipts("throughput")
    p = tput_leg(legs, "bi0", 32, 2)
    edit_meta(p, lambda m: m["resolved_config"].update({field: value}))
    q = throughput_question(required_workload=[f for f in WORKLOAD_FIELDS if f != field])
    cell = judge_criteria("throughput", q, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    rnd = next(x for x in cell.numbers["rounds"] if x["c"] == 32 and x["round"] == 2)
    assert not rnd["valid"] and cell.numbers["per_concurrency"]["32"]["valid_rounds"] == [1, 3]


def test_a_required_unknown_in_a_concurrency_without_budget_is_reported_not_blocking(receipts):
    legs = receipts("throughput")
    _forget(legs, "num_warmups", c=8)
    q = question("throughput", budget={1: 0.1, 32: 0.15, 64: 0.15}, statistical_basis=FIXTURE_BASIS)
    cell = judge_criteria("throughput", q, legs)
    assert cell.verdict is Verdict.PASS, cell.reasons
    assert any("c=8: unknown: num_warmups" in r for r in _reasons(cell, Verdict.PASS))


@pytest.mark.parametrize("field", ["step_basis", "checkpoint_version"])
def test_forward_bi1_steps_without_a_checkpoint_tie_are_inconclusive_named(receipts, field):
    legs = receipts("forward")
    bi1 = leg(legs, "bi1")
    edit_jsonl(bi1 / "metrics.jsonl", lambda rows: [{k: v for k, v in r.items() if k != field} for r in rows], bi1)
    cell = judge_criteria("forward", question("forward"), legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any(f"unknown: {field}" in r for r in _reasons(cell, Verdict.INCONCLUSIVE)), cell.reasons
