"""No false pass on real receipts: the committed H200 legs (tests/fixtures/h200, the newest run of
each item in replay.yaml), copied and bound to the h200-mid4 manifest the way their producer would
have recorded it had it recorded its source commit (`stamp_leg`, resealed). Bound, forward,
backward, update and artifacts pass (the negative control); each test then breaks one thing on
real GPU numbers."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.bound_receipts import stamp_leg
from tica.canaries import drop_post_update_step, edit_json, edit_jsonl, edit_meta, perturb_arrays
from tica.judges import judge, load_candidate
from tica.question import load_question
from tica.verdict import Verdict

from .conftest import (
    H200,
    H200_MANIFEST,
    H200_QUESTIONS,
    E,
    all_reasons,
    assert_no_pass,
    assert_unbound,
    copy_legs,
    leg_of,
    load,
)

SELECTION = yaml.safe_load((H200 / "replay.yaml").read_text())


@pytest.fixture(scope="module")
def h200_candidate():
    return load_candidate(H200_MANIFEST)


def h200_question(item: E):
    return load_question(H200_QUESTIONS / f"{item.value}.yaml")


def newest(item: E) -> list:
    key = "forward" if item is E.ARTIFACTS else item.value
    return [p for pattern in SELECTION[key][-1]["legs"] for p in sorted(H200.glob(pattern))]


@pytest.fixture
def h200_bound(tmp_path, h200_candidate):
    """h200_bound(item[, sources]) -> real legs copied and bound to h200-mid4, checked to pass."""
    n = [0]

    def build(item: E, sources=None, control: bool = True) -> list:
        n[0] += 1
        copies = copy_legs(sources or newest(item), tmp_path / f"{item.value}-{n[0]}")
        legs = [stamp_leg(p, h200_candidate) for p in copies]
        if control:
            cell = judge(item, h200_question(item), legs, h200_candidate)
            assert cell.verdict is Verdict.PASS, ("negative control: the bound real set must pass", cell.reasons[:3])
        return legs

    return build


@pytest.mark.parametrize("item", [E.FORWARD, E.BACKWARD, E.UPDATE, E.ARTIFACTS])
def test_real_h200_receipts_bound_to_their_manifest_pass(item, h200_bound):
    assert h200_bound(item)


def test_a_real_leg_naming_the_quality_models_weights_is_not_evidence_for_the_forward(h200_bound, h200_candidate):
    """The SmolLM2 weights the committed quality legs ran on, recorded by the BI=1 forward leg."""
    smollm2 = load(H200 / "run4" / "quality_bi1" / "leg.json")["resolved_config"]["weights_hash"]
    legs = h200_bound(E.FORWARD)
    edit_meta(legs[0], lambda m: m["resolved_config"].update(weights_hash=smollm2))
    cell = judge(E.FORWARD, h200_question(E.FORWARD), legs, h200_candidate)
    assert_unbound(cell, "checkpoint (weights fingerprint)", "differs")
    assert smollm2 in all_reasons(cell)


def test_a_real_leg_from_the_other_h200s_driver_is_not_evidence(h200_bound, h200_candidate):
    """The committed quality legs ran on an H200 with another driver; the forward leg now says so."""
    driver = load(H200 / "run4" / "quality_bi1" / "leg.json")["device"]["driver"]
    assert driver != h200_candidate.manifest.hardware.driver
    legs = h200_bound(E.FORWARD)
    edit_meta(legs[0], lambda m: m["device"].update(driver=driver))
    cell = judge(E.FORWARD, h200_question(E.FORWARD), legs, h200_candidate)
    assert_unbound(cell, "hardware.driver", "differs")


def test_a_real_bi1_forward_one_ulp_apart_is_not_bitwise(h200_bound, h200_candidate):
    legs = h200_bound(E.FORWARD)
    leg = leg_of(legs, arm="bi1", item="forward")
    first = json.loads((leg / "metrics.jsonl").read_text().splitlines()[0])["step"]
    perturb_arrays(leg, first)
    cell = judge(E.FORWARD, h200_question(E.FORWARD), legs, h200_candidate)
    assert cell.verdict is Verdict.FAIL
    assert_no_pass(cell, f"step {first}", "not bitwise equal")


def test_a_real_bi1_forward_whose_trainer_is_vllm_scoring_itself_is_not_evidence(h200_bound, h200_candidate):
    legs = h200_bound(E.FORWARD)
    edit_meta(leg_of(legs, arm="bi1", item="forward"), lambda m: m.update(trainer="vllm_engine"))
    cell = judge(E.FORWARD, h200_question(E.FORWARD), legs, h200_candidate)
    assert_unbound(cell, "runner.trainer", "differs")


def test_a_real_bi1_forward_scored_on_prefill_fails_even_when_bound(h200_bound, h200_candidate):
    """run3/forward_bi1: vLLM's decode logprobs differ from its own prefill scoring under BI=1."""
    legs = h200_bound(E.FORWARD, [H200 / "run3" / "forward_bi1"], control=False)
    cell = judge(E.FORWARD, h200_question(E.FORWARD), legs, h200_candidate)
    assert cell.verdict is Verdict.FAIL
    assert not cell.numbers["binding"]  # bound: the failure is the criteria's, kept as it is
    assert_no_pass(cell, "decode logprobs differ from the prefill scoring")


def test_a_real_gradient_check_with_one_op_outside_tolerance_fails(h200_bound, h200_candidate):
    legs = h200_bound(E.BACKWARD)
    leg = legs[0]

    def break_rotary(gc):
        op = next(o for o in gc["check"]["ops"] if o["op"] == "rotary")
        op["rel_err"] = [*op["rel_err"][:-1], 0.05]  # tol 0.02; the flags say pass
    edit_json(leg / "gradcheck.json", break_rotary, leg)
    cell = judge(E.BACKWARD, h200_question(E.BACKWARD), legs, h200_candidate)
    assert cell.verdict is Verdict.FAIL
    assert_no_pass(cell, "gradcheck.json", "rotary")


def test_a_real_gradient_check_whose_planted_error_went_undetected_is_no_evidence(h200_bound, h200_candidate):
    legs = h200_bound(E.BACKWARD)
    leg = legs[0]

    def hide(gc):
        control = next(c for c in gc["controls"] if c["planted"] == "linear")
        for op in control["ops"]:
            op["rel_err"] = [min(x, 0.001) for x in op["rel_err"]]
    edit_json(leg / "gradcheck.json", hide, leg)
    cell = judge(E.BACKWARD, h200_question(E.BACKWARD), legs, h200_candidate)
    assert_no_pass(cell, "planted backward errors", "linear")


def test_a_real_backward_whose_metrics_say_the_gradient_check_failed_is_no_pass(h200_bound, h200_candidate):
    legs = h200_bound(E.BACKWARD)
    leg = legs[0]
    edit_jsonl(leg / "metrics.jsonl", lambda rows: rows[0].update({"tica/gradcheck_pass": False}), leg)
    cell = judge(E.BACKWARD, h200_question(E.BACKWARD), legs, h200_candidate)
    assert_no_pass(cell, "tica/gradcheck_pass")


def test_a_real_update_missing_its_last_post_update_step_is_not_a_pass(h200_bound, h200_candidate):
    legs = h200_bound(E.UPDATE)
    drop_post_update_step(h200_question(E.UPDATE), legs)
    cell = judge(E.UPDATE, h200_question(E.UPDATE), legs, h200_candidate)
    assert_no_pass(cell, "post-update", "the question requires 5")


def test_the_real_update_recheck_that_failed_stays_failed_when_bound(h200_bound, h200_candidate):
    """run3/update_bi1 re-checked against vLLM's prefill scoring and failed: binding it changes nothing."""
    legs = h200_bound(E.UPDATE, [H200 / "run3" / "update_bi1"], control=False)
    cell = judge(E.UPDATE, h200_question(E.UPDATE), legs, h200_candidate)
    assert cell.verdict is Verdict.FAIL and not cell.numbers["binding"]
    assert_no_pass(cell, "post-update")


def test_a_real_artifact_edited_after_sealing_is_not_immutable(h200_bound, h200_candidate):
    legs = h200_bound(E.ARTIFACTS)
    leg = leg_of(legs, arm="bi0", item="forward")
    with (leg / "metrics.jsonl").open("a") as f:
        f.write("\n")
    cell = judge(E.ARTIFACTS, h200_question(E.ARTIFACTS), legs, h200_candidate)
    assert cell.verdict is Verdict.FAIL
    assert_no_pass(cell, "metrics.jsonl: changed after sealing")


@pytest.mark.parametrize("item", [E.FORWARD, E.BACKWARD, E.UPDATE])
def test_committed_h200_receipts_unbound_are_no_evidence_for_the_h200_candidate(item, h200_candidate):
    """As committed (no source commit recorded), read in place: not `pass` for the manifest."""
    cell = judge(item, h200_question(item), newest(item), h200_candidate)
    assert cell.verdict is not Verdict.PASS
    assert any(b.get("field") == "source.commit" and b.get("kind") == "unrecorded" for b in cell.numbers["binding"])
