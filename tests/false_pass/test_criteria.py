"""No false pass, criteria: receipt sets bound to the candidate that break one rule of the
practice's evidence items (forward, backward, update, throughput, quality, clean exit, artifacts).

Every set starts from a passing, bound set (the `bound` fixture checks it passes) and is mutated
once, resealed as a producer would have sealed it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.bound_receipts import build_bound
from tica.canaries import (
    scale_throughput,
    _gradcheck,
    _over_one_target,
    _update_as_bi0,
    drop_post_update_step,
    drop_step,
    edit_json,
    edit_jsonl,
    edit_meta,
    logged_only,
    perturb_arrays,
    perturb_arrays_keep_metrics,
    process_exit,
    swap_slots,
    swap_work_times,
    tput_exit,
    tput_leg,
    with_rounds,
)
from tica.judges import judge
from tica.seal import seal_leg
from tica.verdict import Verdict

from .conftest import E, assert_no_pass, leg_of, question_with

# ------------------------------------------------------------------ forward


def test_metrics_claiming_zero_over_nonzero_arrays_are_no_pass(bound, candidate, questions):
    """metrics.jsonl keeps max = mean = 0 while the step's arrays differ by 0.25 everywhere."""
    legs = bound(E.FORWARD)
    perturb_arrays_keep_metrics(leg_of(legs, arm="bi1"), 3)
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_no_pass(cell, "step 3", "contradicts itself")
    assert cell.verdict is Verdict.FAIL  # judged on the arrays: not bitwise


def test_a_bi1_forward_one_ulp_apart_is_not_bitwise(bound, candidate, questions):
    legs = bound(E.FORWARD)
    perturb_arrays(leg_of(legs, arm="bi1"), 2)
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert cell.verdict is Verdict.FAIL
    assert_no_pass(cell, "step 2", "1 logprobs not bitwise equal")


def test_bi1_max_zero_with_a_nonzero_mean_is_not_bitwise(bound, candidate, questions):
    """As verl logs it (no arrays): max 0 but mean 1e-12 at one step."""
    legs = bound(E.FORWARD)
    logged_only(leg_of(legs, arm="bi1"), 4, **{"training/rollout_probs_diff_mean": 1e-12})
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_no_pass(cell, "step 4", "must both be 0")


def test_decode_logprobs_that_differ_from_the_prefill_scoring_are_not_bitwise(bound, candidate, questions):
    """The rollout's own decode logprobs one ulp away from its prefill scoring at one sampled token."""
    legs = bound(E.FORWARD)
    leg = leg_of(legs, arm="bi1")
    path = leg / "arrays" / "step_0005.npz"
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    i = int(np.flatnonzero(data["decode_mask"])[0])
    data["decode_logprobs"] = data["decode_logprobs"].copy()
    data["decode_logprobs"][i] = np.nextafter(data["decode_logprobs"][i], np.float32(0))
    np.savez(path, **data)
    seal_leg(leg)
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_no_pass(cell, "step 5", "decode logprobs differ from the prefill scoring")


def test_a_missing_forward_step_is_not_a_pass(bound, candidate, questions):
    legs = bound(E.FORWARD)
    drop_step(leg_of(legs, arm="bi1"), 3)
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_no_pass(cell, "steps [3] missing")


def test_fewer_forward_steps_than_the_question_freezes_is_not_a_pass(bound, candidate, questions):
    legs = bound(E.FORWARD)
    drop_step(leg_of(legs, arm="bi1"), None)
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_no_pass(cell, "4 steps present, the question requires 5")


def test_arrays_of_a_step_the_metrics_do_not_report_are_not_a_pass(bound, candidate, questions):
    """Step 5 dropped from metrics.jsonl only: its (differing) arrays stay beside the others."""
    legs = bound(E.FORWARD)
    leg = leg_of(legs, arm="bi1")
    perturb_arrays(leg, 5)
    edit_jsonl(leg / "metrics.jsonl", lambda rows: [r for r in rows if r["step"] != 5], leg)
    q = question_with(questions[E.FORWARD], {"min_steps": 4})
    cell = judge(E.FORWARD, q, legs, candidate)
    assert_no_pass(cell, "arrays exist for steps [5]")


def test_the_judged_forward_arm_must_have_run(bound, candidate, questions):
    legs = bound(E.FORWARD)
    cell = judge(E.FORWARD, questions[E.FORWARD], [leg_of(legs, arm="bi0")], candidate)
    assert cell.verdict is Verdict.NOT_RUN
    assert_no_pass(cell, "no BI=1 forward leg")


def test_a_bi1_leg_that_did_not_run_is_not_evidence(bound, candidate, questions):
    legs = bound(E.FORWARD)
    leg = leg_of(legs, arm="bi1")
    edit_meta(leg, lambda m: m.update(not_run_reason="vLLM batch-invariant mode is not supported on this platform"))
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert_no_pass(cell, "did not run")


def test_a_field_the_question_requires_recorded_is_no_pass_when_unknown(bound, candidate, questions):
    """The question's must_record names the switch itself; the BI=1 leg does not record it."""
    q = question_with(questions[E.FORWARD], must_record=[*questions[E.FORWARD].must_record, "env.VLLM_BATCH_INVARIANT"])
    legs = bound(E.FORWARD, question=q)
    edit_meta(leg_of(legs, arm="bi1"), lambda m: m["env"].pop("VLLM_BATCH_INVARIANT"))
    cell = judge(E.FORWARD, q, legs, candidate)
    assert_no_pass(cell, "env.VLLM_BATCH_INVARIANT not recorded")


def test_a_bi0_smoke_forward_with_a_nan_grad_norm_fails(bound, candidate, questions):
    q = question_with(questions[E.FORWARD], {"arms": ["bi0"]})
    legs = bound(E.FORWARD, question=q)
    leg = leg_of(legs, arm="bi0")
    edit_jsonl(leg / "metrics.jsonl", lambda rows: rows[2].update({"actor/grad_norm": float("nan")}), leg)
    cell = judge(E.FORWARD, q, legs, candidate)
    assert_no_pass(cell, "step 3", "grad norm is nan")


# ------------------------------------------------------------------ backward


def test_a_backward_with_only_bi0_legs_is_no_evidence_for_the_on_policy_trainer(bound, candidate, questions):
    legs = bound(E.BACKWARD)
    cell = judge(E.BACKWARD, questions[E.BACKWARD], [leg_of(legs, arm="bi0")], candidate)
    assert cell.verdict is Verdict.NOT_RUN
    assert_no_pass(cell, "no BI=1 backward leg ran")


def test_a_backward_whose_recorded_gradient_check_failed_is_no_pass(bound, candidate, questions):
    legs = bound(E.BACKWARD)
    _gradcheck(passed=False, caught=True)(questions[E.BACKWARD], legs)
    cell = judge(E.BACKWARD, questions[E.BACKWARD], legs, candidate)
    assert cell.verdict is Verdict.FAIL
    assert_no_pass(cell, "gradient check failed")


def test_a_gradient_check_that_missed_its_planted_errors_is_no_evidence(bound, candidate, questions):
    legs = bound(E.BACKWARD)
    _gradcheck(passed=True, caught=False)(questions[E.BACKWARD], legs)
    cell = judge(E.BACKWARD, questions[E.BACKWARD], legs, candidate)
    assert_no_pass(cell, "did not detect the planted backward errors")


def test_gradients_that_do_not_reach_every_master_weight_fail(bound, candidate, questions):
    legs = bound(E.BACKWARD)
    leg = leg_of(legs, arm="bi1")
    edit_jsonl(leg / "metrics.jsonl", lambda rows: rows[1].update(params_with_grad=23, params_nonzero_grad=23), leg)
    cell = judge(E.BACKWARD, questions[E.BACKWARD], legs, candidate)
    assert_no_pass(cell, "step 2", "23 of 24 master parameters")


def test_a_zero_grad_norm_under_varied_rewards_is_a_fault(bound, candidate, questions):
    legs = bound(E.BACKWARD)
    leg = leg_of(legs, arm="bi1")
    edit_jsonl(leg / "metrics.jsonl", lambda rows: rows[0].update({"actor/grad_norm": 0.0}), leg)
    cell = judge(E.BACKWARD, questions[E.BACKWARD], legs, candidate)
    assert_no_pass(cell, "grad norm exactly 0 while rewards vary")


# ------------------------------------------------------------------ update


def test_an_update_with_only_a_bi0_leg_and_post_update_logprobs_off_by_a_tenth_is_no_evidence(bound, candidate,
                                                                                              questions):
    legs = bound(E.UPDATE)
    _update_as_bi0(questions[E.UPDATE], legs)
    cell = judge(E.UPDATE, questions[E.UPDATE], legs, candidate)
    assert cell.verdict is Verdict.NOT_RUN
    assert_no_pass(cell, "no BI=1 update leg ran")


def test_an_update_missing_a_post_update_step_is_not_a_pass(bound, candidate, questions):
    legs = bound(E.UPDATE)
    drop_post_update_step(questions[E.UPDATE], legs)
    cell = judge(E.UPDATE, questions[E.UPDATE], legs, candidate)
    assert_no_pass(cell, "post-update", "4 steps present, the question requires 5")


def test_an_update_without_a_post_update_forward_was_not_rechecked(bound, candidate, questions):
    import shutil

    legs = bound(E.UPDATE)
    shutil.rmtree(legs[0] / "post_forward")
    seal_leg(legs[0])
    cell = judge(E.UPDATE, questions[E.UPDATE], legs, candidate)
    assert_no_pass(cell, "no post-update forward")


def test_a_post_update_forward_one_ulp_apart_is_not_bitwise(bound, candidate, questions):
    legs = bound(E.UPDATE)
    perturb_arrays(legs[0], 4, "post_forward")
    cell = judge(E.UPDATE, questions[E.UPDATE], legs, candidate)
    assert cell.verdict is Verdict.FAIL
    assert_no_pass(cell, "post-update step 4", "not bitwise equal")


def test_an_update_the_rollout_did_not_reload_fails(bound, candidate, questions):
    legs = bound(E.UPDATE)
    edit_jsonl(legs[0] / "metrics.jsonl", lambda rows: rows[0].update(reloaded_by_rollout=None), legs[0])
    cell = judge(E.UPDATE, questions[E.UPDATE], legs, candidate)
    assert_no_pass(cell, "weight sync to the rollout engine not recorded")


def test_a_post_update_recheck_on_the_original_weights_is_not_a_recheck_of_the_update(bound, candidate, questions):
    legs = bound(E.UPDATE)
    leg = legs[0]
    before = json.loads((leg / "leg.json").read_text())["resolved_config"]["weights_hash"]

    def same(rows):
        for r in rows:
            r["updated_weights_hash"] = before

    def served(rows):
        for r in rows:
            r["checkpoint_version"] = before
    edit_jsonl(leg / "metrics.jsonl", same, leg)
    edit_jsonl(leg / "post_forward" / "metrics.jsonl", served, leg)
    cell = judge(E.UPDATE, questions[E.UPDATE], legs, candidate)
    assert_no_pass(cell, pattern=r"updated weights|weights_hash|did not (change|update)")


# ------------------------------------------------------------------ throughput


def test_throughput_with_a_bi1_client_exit_1_is_not_a_pass(bound, candidate, questions):
    legs = bound(E.THROUGHPUT)
    tput_exit("bi1", "client", exit_code=1)(questions[E.THROUGHPUT], legs)
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert_no_pass(cell, "client pid", "exit code 1", "c=1: 4 valid round(s) of the 5 frozen")


def test_throughput_with_a_bi1_api_server_force_killed_is_not_a_pass(bound, candidate, questions):
    legs = bound(E.THROUGHPUT)
    tput_exit("bi1", "api_server", end_state="force_killed",
              evidence="Force killing remaining processes count=1")(questions[E.THROUGHPUT], legs)
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert_no_pass(cell, "api_server", "force_killed")


def test_throughput_whose_engine_core_was_force_killed_behind_exit_code_0_is_not_a_pass(bound, candidate, questions):
    legs = bound(E.THROUGHPUT)
    leg = tput_leg(legs, "bi1", 64, 3)
    edit_meta(leg, lambda m: next(p for p in m["processes"] if p["role"] == "engine_core").update(
        evidence="Force killing remaining process EngineCore (pid 8203)"))
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert_no_pass(cell, "engine_core", "force killed")


def test_throughput_whose_leg_records_no_exits_is_not_a_pass(bound, candidate, questions):
    legs = bound(E.THROUGHPUT)
    tput_exit("bi0", "client")(questions[E.THROUGHPUT], legs)
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert_no_pass(cell, "client exit not recorded")


def test_an_infinite_throughput_is_not_a_measurement(bound, candidate, questions):
    legs = bound(E.THROUGHPUT)
    leg = tput_leg(legs, "bi1", 8, 1)
    edit_json(leg / "bench.json", lambda b: b.update(output_throughput=float("inf")), leg)
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert_no_pass(cell, "output_throughput", "not a finite number")


def test_a_zero_throughput_is_not_a_measurement(bound, candidate, questions):
    legs = bound(E.THROUGHPUT)
    leg = tput_leg(legs, "bi0", 8, 1)
    edit_json(leg / "bench.json", lambda b: b.update(output_throughput=0.0), leg)
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert_no_pass(cell, "output_throughput is 0.0")


def test_a_round_in_the_swapped_order_breaks_the_frozen_crossing(bound, candidate, questions):
    legs = bound(E.THROUGHPUT)
    swap_slots(questions[E.THROUGHPUT], legs)
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert_no_pass(cell, "the frozen order AB")


def test_work_times_that_contradict_the_slots_break_the_frozen_crossing(bound, candidate, questions):
    legs = bound(E.THROUGHPUT)
    swap_work_times(questions[E.THROUGHPUT], legs)
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert_no_pass(cell, "not before slot 2")


def test_a_profiled_leg_is_never_a_formal_measurement(bound, candidate, questions):
    legs = bound(E.THROUGHPUT)
    edit_meta(tput_leg(legs, "bi0", 32, 2), lambda m: m.update(profiled=True))
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert_no_pass(cell, "profiled: never a formal end-to-end measurement")


def test_a_bench_marked_profiled_in_its_metadata_is_never_a_formal_measurement(bound, candidate, questions):
    legs = bound(E.THROUGHPUT)
    leg = tput_leg(legs, "bi1", 1, 3)
    edit_json(leg / "bench.json", lambda b: b.update(profiled="true"), leg)
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert_no_pass(cell, "profiled")


def test_a_leg_short_of_its_output_tokens_is_an_invalid_workload(bound, candidate, questions):
    legs = bound(E.THROUGHPUT)
    leg = tput_leg(legs, "bi1", 32, 1)
    edit_json(leg / "bench.json", lambda b: b.update(total_output_tokens=b["total_output_tokens"] - 1), leg)
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert_no_pass(cell, "total_output_tokens")


def test_one_concurrency_over_budget_fails_whatever_the_average(bound, candidate, questions):
    legs = bound(E.THROUGHPUT)
    _over_one_target(questions[E.THROUGHPUT], legs)
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert cell.verdict is Verdict.FAIL
    assert_no_pass(cell, "c=64", "aggregate overrun")


def test_throughput_without_a_frozen_formula_and_budget_is_not_declared_passed(candidate, questions, tmp_path):
    """The question itself is the mutation: the same legs, measured, are never declared passed."""
    q = question_with(questions[E.THROUGHPUT], {"formula": None, "budget": None, "statistical_basis": None})
    legs = build_bound(E.THROUGHPUT, q, candidate, tmp_path / "legs")
    cell = judge(E.THROUGHPUT, q, legs, candidate)
    assert_no_pass(cell, "no frozen formula and budget")


def test_a_budget_without_a_reviewed_statistical_basis_is_never_declared_passed(bound, candidate, questions):
    """The practice: without a reviewed statistical basis, report only measured values and do not
    declare the budget passed. The question is the mutation: the same bound legs (which pass under
    the basis: the `bound` negative control) are judged under the question without it."""
    legs = bound(E.THROUGHPUT)
    bare = question_with(questions[E.THROUGHPUT], {"statistical_basis": None})
    cell = judge(E.THROUGHPUT, bare, legs, candidate)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert_no_pass(cell, "c=64: loss", "under the budget 0.15", "no reviewed statistical basis",
                   "reported, not passed")
    assert all(e["over_budget"] is False for e in cell.numbers["per_concurrency"].values())  # all under
    assert judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate).verdict is Verdict.PASS  # control


def test_a_budget_overrun_without_a_statistical_basis_still_fails(bound, candidate, questions):
    """No basis takes the pass away, never the fail: a target c over budget by the frozen rule fails."""
    legs = bound(E.THROUGHPUT)
    bare = question_with(questions[E.THROUGHPUT], {"statistical_basis": None})
    _over_one_target(bare, legs)
    cell = judge(E.THROUGHPUT, bare, legs, candidate)
    assert cell.verdict is Verdict.FAIL
    assert_no_pass(cell, "c=64", "aggregate overrun")


def test_a_throughput_its_own_tokens_and_duration_contradict_is_no_pass(bound, candidate, questions):
    """The BI=1 legs at c=64 claim 1.5x the throughput; their tokens and duration are untouched."""
    legs = bound(E.THROUGHPUT)
    for r in (1, 2, 3):
        leg = tput_leg(legs, "bi1", 64, r)
        edit_json(leg / "bench.json", lambda b: b.update(output_throughput=b["output_throughput"] * 1.5), leg)
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert_no_pass(cell, pattern=r"output_throughput|duration|contradict")


def test_an_infinite_total_token_throughput_is_not_a_measurement(bound, candidate, questions):
    q = question_with(questions[E.THROUGHPUT], {"throughput_metric": "total_token_throughput"})
    legs = bound(E.THROUGHPUT, question=q)
    leg = tput_leg(legs, "bi1", 64, 1)
    edit_json(leg / "bench.json", lambda b: b.update(total_token_throughput=float("inf")), leg)
    cell = judge(E.THROUGHPUT, q, legs, candidate)
    assert_no_pass(cell, pattern=r"total_token_throughput.*(inf|finite)")


def test_rounds_beyond_the_frozen_repeats_do_not_dilute_an_overrun(bound, candidate, questions):
    q5 = questions[E.THROUGHPUT]  # 5 frozen rounds (and a sign-test basis over 5)
    q7 = with_rounds(q5, 7)
    legs = bound(E.THROUGHPUT, question=q7)
    base = json.loads((tput_leg(legs, "bi0", 64, 1) / "bench.json").read_text())["output_throughput"]
    for r in range(1, 8):  # within each arm max/min stays under the 1.15 tier ratio
        t0 = base * (1.035 if r <= 3 else 0.965)
        for arm, t in (("bi0", t0), ("bi1", t0 * (0.80 if r <= 3 else 0.92))):
            leg = tput_leg(legs, arm, 64, r)
            now = json.loads((leg / "bench.json").read_text())["output_throughput"]
            scale_throughput(leg, t / now)
    # the 5 frozen rounds: 3 over the budget, median over it; all 7: median under it
    frozen = [p for p in legs if json.loads((p / "leg.json").read_text())["round"] <= 5]
    assert judge(E.THROUGHPUT, q5, frozen, candidate).verdict is Verdict.FAIL  # the frozen rounds: over budget
    cell = judge(E.THROUGHPUT, q5, legs, candidate)
    assert_no_pass(cell, pattern=r"round [4-7]|frozen|repeats")


# ------------------------------------------------------------------ quality


CONTRACT_CHANGES = [
    ("dataset_version", "dataset version", "openai/gsm8k@main:test[:30] sha256:0000"),
    ("prompt_template", "prompt/chat template and thinking mode", "qwen3-chat sha256:0000"),
    ("thinking_mode", "prompt/chat template and thinking mode", "on"),
    ("sampling.seed", "sampling parameters", 1),
    ("repeats", "number of repeats", 2),
    ("scorer", "scorer", "verl.gsm8k/2 sha256:0bb1"),
    ("length_cap", "length cap", 4096),
]


@pytest.mark.parametrize("key, name, value", CONTRACT_CHANGES, ids=[k for k, _, _ in CONTRACT_CHANGES])
def test_two_scores_under_differing_contracts_are_never_compared(key, name, value, bound, candidate, questions):
    legs = bound(E.QUALITY)
    leg = leg_of(legs, arm="bi0")

    def change(c):
        node = c
        parts = key.split(".")
        for part in parts[:-1]:
            node = node[part]
        node[parts[-1]] = value
    edit_json(leg / "contract.json", change, leg)
    cell = judge(E.QUALITY, questions[E.QUALITY], legs, candidate)
    assert_no_pass(cell, f"evaluation contract differs in {name}")


def test_a_retried_problem_is_not_allowed(bound, candidate, questions):
    legs = bound(E.QUALITY)
    leg = leg_of(legs, arm="bi1")
    edit_jsonl(leg / "results.jsonl", lambda rows: rows + [dict(rows[4], correct=not rows[4]["correct"])], leg)
    cell = judge(E.QUALITY, questions[E.QUALITY], legs, candidate)
    assert_no_pass(cell, "gsm8k-test-0004", "retries are not allowed")


def test_a_problem_without_its_pair_cannot_be_counted(bound, candidate, questions):
    legs = bound(E.QUALITY)
    leg = leg_of(legs, arm="bi0")
    edit_jsonl(leg / "results.jsonl", lambda rows: rows[:-1], leg)
    cell = judge(E.QUALITY, questions[E.QUALITY], legs, candidate)
    assert_no_pass(cell, "gsm8k-test-0029", "cannot be paired")


def test_a_problem_id_whose_prompts_differ_is_not_one_problem(bound, candidate, questions):
    legs = bound(E.QUALITY)
    leg = leg_of(legs, arm="bi0")
    edit_jsonl(leg / "results.jsonl", lambda rows: rows[7].update(prompt_hash="sha256:" + "0f" * 32), leg)
    cell = judge(E.QUALITY, questions[E.QUALITY], legs, candidate)
    assert_no_pass(cell, "gsm8k-test-0007", "different prompts")


def test_a_quality_pairing_with_one_arm_missing_is_not_a_pass(bound, candidate, questions):
    legs = bound(E.QUALITY)
    cell = judge(E.QUALITY, questions[E.QUALITY], [leg_of(legs, arm="bi1")], candidate)
    assert_no_pass(cell, "pairing needs exactly one per arm")


def test_sampling_under_a_greedy_question_is_not_the_frozen_score(bound, candidate, questions):
    legs = bound(E.QUALITY)
    for leg in legs:
        edit_json(leg / "contract.json", lambda c: c["sampling"].update(temperature=0.7), leg)
    cell = judge(E.QUALITY, questions[E.QUALITY], legs, candidate)
    assert_no_pass(cell, "greedy decoding")


# ------------------------------------------------------------------ clean exit


def test_a_clean_exit_code_with_a_force_killed_engine_core_is_not_clean(bound, candidate, questions):
    legs = bound(E.CLEAN_EXIT)
    process_exit("engine_core", evidence="Force killing remaining process EngineCore (pid 9002)")(
        questions[E.CLEAN_EXIT], legs)
    cell = judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, candidate)
    assert cell.verdict is Verdict.FAIL
    assert_no_pass(cell, "engine_core", "force killed")


def test_a_client_exit_1_is_not_clean(bound, candidate, questions):
    legs = bound(E.CLEAN_EXIT)
    process_exit("client", exit_code=1)(questions[E.CLEAN_EXIT], legs)
    cell = judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, candidate)
    assert_no_pass(cell, "client: ", "exit code 1")


def test_a_worker_killed_by_a_signal_is_not_clean(bound, candidate, questions):
    legs = bound(E.CLEAN_EXIT)
    process_exit("worker", end_state="signalled", exit_code=None, signal="SIGKILL")(questions[E.CLEAN_EXIT], legs)
    cell = judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, candidate)
    assert_no_pass(cell, "worker", "SIGKILL")


def test_an_engine_core_whose_exit_was_not_recorded_cannot_be_verified(bound, candidate, questions):
    legs = bound(E.CLEAN_EXIT)
    for leg in legs:
        edit_meta(leg, lambda m: m.update(processes=[p for p in m["processes"] if p["role"] != "engine_core"]))
    cell = judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, candidate)
    assert_no_pass(cell, "no exit receipt for roles ['engine_core']")


def test_a_process_recorded_exited_without_an_exit_code_is_not_clean(bound, candidate, questions):
    legs = bound(E.CLEAN_EXIT)
    process_exit("api_server", exit_code=None)(questions[E.CLEAN_EXIT], legs)
    cell = judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, candidate)
    assert_no_pass(cell, "api_server", "exit code None")


def test_a_clean_exit_in_which_nothing_ran_is_not_a_pass(bound, candidate, questions):
    q = question_with(questions[E.CLEAN_EXIT], {"required_roles": []})
    legs = bound(E.CLEAN_EXIT, question=q)
    for leg in legs:
        edit_meta(leg, lambda m: m.update(not_run_reason="no GPU on this runner", processes=[]))
    cell = judge(E.CLEAN_EXIT, q, legs, candidate)
    assert_no_pass(cell, pattern=r"did not run|not run|no exit")


# ------------------------------------------------------------------ artifacts


def test_weights_named_by_a_name_not_a_content_hash_are_not_immutable(bound, candidate, questions):
    legs = bound(E.ARTIFACTS)
    edit_jsonl(legs[-1] / "metrics.jsonl", lambda rows: rows[0].update(updated_weights_hash="qwen3-8b-step1"),
               legs[-1])
    cell = judge(E.ARTIFACTS, questions[E.ARTIFACTS], legs, candidate)
    assert cell.verdict is Verdict.FAIL
    assert_no_pass(cell, "'qwen3-8b-step1', not by a content hash")


def test_artifacts_in_which_no_leg_ran_and_no_weights_are_named_are_not_a_pass(bound, candidate, questions):
    legs = bound(E.ARTIFACTS)
    for leg in legs:
        edit_meta(leg, lambda m: (m.update(not_run_reason="no GPU on this runner"),
                                  m["resolved_config"].pop("weights_hash")))
    cell = judge(E.ARTIFACTS, questions[E.ARTIFACTS], legs, candidate)
    assert_no_pass(cell, pattern=r"not run|weights")
