"""Backward and update: finite gradients reaching the master weights; a grad norm of exactly 0
is checked against within-group rewards before it is a fault; the forward is re-checked on the
updated weights."""

from __future__ import annotations

import shutil

from tica.canaries import perturb_arrays, edit_jsonl, edit_meta
from tica.judges import judge_criteria
from tica.seal import seal_leg
from tica.verdict import Verdict

from .conftest import leg, question

QB = question("backward")
QU = question("update")


def _set(p, i, **kv):
    edit_jsonl(p / "metrics.jsonl", lambda rows: rows[i].update(kv), p)


def test_finite_gradients_reaching_every_master_param_pass(receipts):
    cell = judge_criteria("backward", QB, receipts("backward"))
    assert cell.verdict is Verdict.PASS, cell.reasons
    assert all(s["reading"] == "gradient reaches weights" for l in cell.numbers["legs"] for s in l["steps"])


def test_non_finite_grad_norm_fails(receipts):
    legs = receipts("backward")
    _set(leg(legs, "bi0"), 0, **{"actor/grad_norm": float("inf")})
    assert judge_criteria("backward", QB, legs).verdict is Verdict.FAIL


def test_gradients_missing_from_some_master_params_fail(receipts):
    legs = receipts("backward")
    _set(leg(legs, "bi1"), 2, params_with_grad=23)
    cell = judge_criteria("backward", QB, legs)
    assert cell.verdict is Verdict.FAIL and "23 of 24" in cell.reasons[0]
    # control: a question that accepts 90% coverage passes the same receipts
    assert judge_criteria("backward", question("backward", min_params_with_grad_fraction=0.9), legs).verdict is Verdict.PASS


def test_zero_grad_norm_with_varied_group_rewards_is_a_fault(receipts):
    legs = receipts("backward")
    _set(leg(legs, "bi1"), 1, **{"actor/grad_norm": 0.0})
    cell = judge_criteria("backward", QB, legs)
    assert cell.verdict is Verdict.FAIL and "numerical fault" in cell.reasons[0]


def test_zero_grad_norm_with_equal_group_rewards_is_zero_advantage_not_a_fault(receipts):
    legs = receipts("backward")
    _set(leg(legs, "bi1"), 1, **{"actor/grad_norm": 0.0, "within_group_rewards": [[1, 1, 1, 1], [0, 0, 0, 0]]})
    cell = judge_criteria("backward", QB, legs)
    assert cell.verdict is Verdict.PASS
    assert any("advantage 0" in r for r in cell.reasons)


def test_zero_grad_norm_without_rewards_cannot_be_called_either_way(receipts):
    legs = receipts("backward")
    _set(leg(legs, "bi1"), 1, **{"actor/grad_norm": 0.0, "within_group_rewards": None})
    assert judge_criteria("backward", QB, legs).verdict is Verdict.INCONCLUSIVE


def test_only_zero_advantage_steps_show_nothing_about_gradients(receipts):
    legs = receipts("backward")
    p = leg(legs, "bi1")
    edit_jsonl(p / "metrics.jsonl", lambda rows: [dict(r, **{"actor/grad_norm": 0.0, "within_group_rewards": [[1, 1]]})
                                                  for r in rows], p)
    assert judge_criteria("backward", QB, legs).verdict is Verdict.INCONCLUSIVE


def test_forward_not_on_deployed_bytes_fails(receipts):
    legs = receipts("backward")
    _set(leg(legs, "bi0"), 0, deployed_bytes_equal=False)
    assert judge_criteria("backward", QB, legs).verdict is Verdict.FAIL


def test_quantized_weights_without_the_deployed_bytes_check_are_inconclusive(receipts):
    legs = receipts("backward")
    p = leg(legs, "bi0")
    edit_jsonl(p / "metrics.jsonl", lambda rows: [dict(r, deployed_bytes_equal=None) for r in rows], p)
    assert judge_criteria("backward", QB, legs).verdict is Verdict.PASS  # unquantified: nothing to check
    edit_meta(p, lambda m: m["resolved_config"].update(quantization="nvfp4"))
    assert judge_criteria("backward", QB, legs).verdict is Verdict.INCONCLUSIVE


def test_real_update_passes(receipts):
    cell = judge_criteria("update", QU, receipts("update"))
    assert cell.verdict is Verdict.PASS, cell.reasons
    assert cell.numbers["legs"][0]["post_forward"]["verdict"] == "pass"
    assert any(t.startswith("post-update forward") for t in cell.tables)


def test_update_that_changes_no_weights_fails(receipts):
    legs = receipts("update")
    _set(legs[0], 0, weights_changed_tensors=3)
    assert judge_criteria("update", QU, legs).verdict is Verdict.FAIL


def test_rollout_not_reloading_the_weights_fails(receipts):
    legs = receipts("update")
    _set(legs[0], 0, reloaded_by_rollout=False)
    assert judge_criteria("update", QU, legs).verdict is Verdict.FAIL


def test_post_update_forward_not_bitwise_fails(receipts):
    legs = receipts("update")
    perturb_arrays(legs[0], 1, "post_forward")
    assert judge_criteria("update", QU, legs).verdict is Verdict.FAIL


def test_post_update_forward_on_the_old_weights_fails(receipts):
    legs = receipts("update")
    p = legs[0] / "post_forward"
    edit_jsonl(p / "metrics.jsonl", lambda rows: rows[0].update(checkpoint_version="blake3:" + "00" * 32), legs[0])
    cell = judge_criteria("update", QU, legs)
    assert cell.verdict is Verdict.FAIL and "not the updated weights" in cell.reasons[0]


def test_update_without_a_post_update_forward_is_not_a_pass(receipts):
    legs = receipts("update")
    shutil.rmtree(legs[0] / "post_forward")
    seal_leg(legs[0])
    assert judge_criteria("update", QU, legs).verdict is Verdict.INCONCLUSIVE
    assert judge_criteria("update", question("update", recheck_forward_bitwise=False), legs).verdict is Verdict.PASS


def test_update_under_another_optimizer_answers_another_question(receipts):
    legs = receipts("update")
    assert judge_criteria("update", question("update", optimizer="muon"), legs).verdict is Verdict.INCONCLUSIVE
