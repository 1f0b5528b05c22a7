"""No false pass, receipts: missing, unknown, malformed or unsealed evidence never yields `pass`.

These are tampers (a file edited after sealing, without resealing) and malformed legs; each
starts from a bound set that passes, and most try to turn a set that would not pass into one that
would (so a seal that did not hold would show up as a pass)."""

from __future__ import annotations

import json
import shutil

import numpy as np

from tica.canaries import edit_meta, perturb_arrays, tput_leg
from tica.judges import judge
from tica.seal import seal_leg
from tica.verdict import Verdict

from .conftest import OTHER_WEIGHTS, E, assert_no_pass, leg_of, load


def test_a_receipt_changed_after_sealing_is_no_evidence(bound, candidate, questions):
    """A leg that recorded another checkpoint, edited afterwards to name the candidate's weights."""
    legs = bound(E.FORWARD)
    leg = leg_of(legs, arm="bi1")
    edit_meta(leg, lambda m: m["resolved_config"].update(weights_hash=OTHER_WEIGHTS))
    meta = load(leg / "leg.json")
    meta["resolved_config"]["weights_hash"] = candidate.weights
    (leg / "leg.json").write_text(json.dumps(meta, indent=1))  # not resealed
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_no_pass(cell, "leg.json: changed after sealing")


def test_arrays_restored_after_sealing_do_not_undo_a_failure(bound, candidate, questions):
    """A one-ulp failure whose arrays and metrics are put back afterwards, the seal left as it was."""
    legs = bound(E.FORWARD)
    leg = leg_of(legs, arm="bi1")
    good = {p: p.read_bytes() for p in [leg / "arrays" / "step_0002.npz", leg / "metrics.jsonl"]}
    perturb_arrays(leg, 2)
    for path, data in good.items():
        path.write_bytes(data)
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_no_pass(cell, "changed after sealing")


def test_a_file_added_after_sealing_is_no_evidence(bound, candidate, questions):
    legs = bound(E.FORWARD)
    leg = leg_of(legs, arm="bi1")
    shutil.copy(leg / "arrays" / "step_0005.npz", leg / "arrays" / "step_0006.npz")
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_no_pass(cell, "step_0006.npz: added after sealing")


def test_a_sealed_file_removed_after_sealing_is_no_evidence(bound, candidate, questions):
    """The failing step's arrays deleted after sealing (the metrics alone would say 0 ... if they could)."""
    legs = bound(E.UPDATE)
    (legs[0] / "post_forward" / "arrays" / "step_0003.npz").unlink()
    cell = judge(E.UPDATE, questions[E.UPDATE], legs, candidate)
    assert_no_pass(cell, "step_0003.npz: sealed file is missing")


def test_a_leg_whose_leg_json_is_missing_is_no_evidence(bound, candidate, questions):
    legs = bound(E.BACKWARD)
    (leg_of(legs, arm="bi1") / "leg.json").unlink()
    cell = judge(E.BACKWARD, questions[E.BACKWARD], legs, candidate)
    assert_no_pass(cell, "leg.json: sealed file is missing", "leg.json: unreadable")


def test_a_leg_sealed_without_leg_json_is_no_evidence(bound, candidate, questions):
    """Resealed honestly after leg.json was lost: the seal holds, the leg records nothing."""
    legs = bound(E.CLEAN_EXIT)
    (legs[0] / "leg.json").unlink()
    seal_leg(legs[0])
    cell = judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, candidate)
    assert_no_pass(cell, "leg.json", "unreadable")


def test_a_leg_without_a_seal_is_no_evidence(bound, candidate, questions):
    legs = bound(E.QUALITY)
    (leg_of(legs, arm="bi0") / "seal.json").unlink()
    cell = judge(E.QUALITY, questions[E.QUALITY], legs, candidate)
    assert_no_pass(cell, "seal.json: missing seal")


def test_a_leg_whose_seal_is_unreadable_is_no_evidence(bound, candidate, questions):
    legs = bound(E.THROUGHPUT)
    leg = tput_leg(legs, "bi1", 32, 3)
    (leg / "seal.json").write_text("{not json")
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert_no_pass(cell, "unreadable seal")


def test_a_seal_listing_no_files_does_not_cover_the_leg(bound, candidate, questions):
    legs = bound(E.CLEAN_EXIT)
    seal = load(legs[1] / "seal.json")
    seal["files"] = {}
    (legs[1] / "seal.json").write_text(json.dumps(seal))
    cell = judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, candidate)
    assert_no_pass(cell, "leg.json: added after sealing")


def test_a_malformed_metrics_line_is_no_evidence(bound, candidate, questions):
    legs = bound(E.FORWARD)
    leg = leg_of(legs, arm="bi1")
    with (leg / "metrics.jsonl").open("a") as f:
        f.write('{"step": 6, "training/rollout_probs_diff_max": 0.0\n')
    seal_leg(leg)
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_no_pass(cell, "metrics.jsonl", "malformed JSON")


def test_arrays_of_another_dtype_are_no_evidence(bound, candidate, questions):
    """float64 logprobs would hide float32 ulps: refused, never compared."""
    legs = bound(E.FORWARD)
    leg = leg_of(legs, arm="bi1")
    path = leg / "arrays" / "step_0001.npz"
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    data["rollout_logprobs"] = data["rollout_logprobs"].astype(np.float64)
    data["trainer_logprobs"] = data["trainer_logprobs"].astype(np.float64)
    np.savez(path, **data)
    seal_leg(leg)
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_no_pass(cell, "trainer_logprobs", "dtype float64")


def test_a_leg_whose_producer_recorded_errors_is_incomplete(bound, candidate, questions):
    legs = bound(E.BACKWARD)
    edit_meta(leg_of(legs, arm="bi1"), lambda m: m.update(errors=["CUDA error: an illegal memory access (step 3)"]))
    cell = judge(E.BACKWARD, questions[E.BACKWARD], legs, candidate)
    assert_no_pass(cell, "producer error", "illegal memory access")


def test_a_leg_whose_switch_contradicts_its_arm_is_mislabelled(bound, candidate, questions):
    legs = bound(E.FORWARD)
    edit_meta(leg_of(legs, arm="bi1"), lambda m: m["env"].update(VLLM_BATCH_INVARIANT="0"))
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_no_pass(cell, "VLLM_BATCH_INVARIANT")


def test_a_leg_of_another_item_is_not_evidence_for_this_one(bound, candidate, questions):
    legs = bound(E.BACKWARD) + [bound(E.UPDATE)[0]]
    cell = judge(E.BACKWARD, questions[E.BACKWARD], legs, candidate)
    assert_no_pass(cell, "is a update leg, not a backward leg")


def test_a_question_for_another_item_judges_nothing(bound, candidate, questions):
    legs = bound(E.FORWARD)
    cell = judge(E.FORWARD, questions[E.UPDATE], legs, candidate)
    assert_no_pass(cell, "is for update, not forward")


def test_no_receipts_at_all_is_never_a_pass(candidate, questions):
    for item in E:
        cell = judge(item, questions[item], [], candidate)
        assert cell.verdict is not Verdict.PASS, (item, cell.summary)
        assert cell.reasons, item
