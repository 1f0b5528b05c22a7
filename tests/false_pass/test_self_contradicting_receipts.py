"""False passes found by the session-8 audit, each closed: a receipt that contradicts itself, a
value of the wrong JSON type, or legs that did not run are never evidence for a pass. Every test
starts from a set that passes for the candidate (the `bound` fixture's negative control) and
changes one thing, resealed as an honest producer could have sealed it."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tica.canaries import edit_jsonl, edit_meta
from tica.judges import judge
from tica.seal import seal_leg
from tica.verdict import Verdict

from .conftest import E, assert_no_pass, leg_of


def _rows(leg, fn, name="metrics.jsonl"):
    edit_jsonl(leg / name, lambda rows: [fn(r) for r in rows] and None, leg)


def _logged_only(leg):
    """The leg judged from its logged numbers (as an ingested verl run is): no arrays."""
    shutil.rmtree(leg / "arrays")
    seal_leg(leg)


# ----------------------------------------------------------------------------------- clean exit
def test_clean_exit_legs_that_did_not_run_are_no_evidence_of_a_clean_exit(bound, candidate, questions):
    legs = bound(E.CLEAN_EXIT)
    for leg in legs:
        edit_meta(leg, lambda m: m.update(not_run_reason="the engine did not start"))
    cell = judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, candidate)
    assert cell.verdict is Verdict.NOT_RUN, cell.reasons
    assert_no_pass(cell, "no leg that ran recorded one")


def test_an_exit_recorded_as_exited_that_names_a_kill_signal_is_not_clean(bound, candidate, questions):
    legs = bound(E.CLEAN_EXIT)
    edit_meta(legs[0], lambda m: m["processes"][0].update(signal="SIGKILL"))
    assert_no_pass(judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, candidate), "names signal SIGKILL")


@pytest.mark.parametrize("code", [False, "0", 0.5])  # 0.0 is the number 0 (tica.receipts.as_read)
def test_an_exit_code_of_another_json_type_is_malformed_not_zero(bound, candidate, questions, code):
    legs = bound(E.CLEAN_EXIT)
    edit_meta(legs[0], lambda m: m["processes"][0].update(exit_code=code))
    assert_no_pass(judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, candidate), "exit_code")


# ----------------------------------------------------------------------------------- forward
@pytest.mark.parametrize("key,value", [("tica/logprob_abs_diff_max", 0.25), ("rollout_corr/k3_kl", 0.1),
                                       ("training/rollout_probs_diff_std", 1e-9)])
def test_a_bi1_step_whose_logged_numbers_show_a_difference_fails(bound, candidate, questions, key, value):
    legs = bound(E.FORWARD)
    leg = leg_of(legs, arm="bi1")
    _logged_only(leg)
    _rows(leg, lambda r: r.update({key: value}))
    cell = judge(E.FORWARD, questions[E.FORWARD], legs, candidate)
    assert cell.verdict is Verdict.FAIL, cell.reasons
    assert_no_pass(cell, "not bitwise equal")


def test_a_step_that_compared_no_tokens_is_not_a_measurement(bound, candidate, questions):
    legs = bound(E.FORWARD)
    leg = leg_of(legs, arm="bi1")
    _logged_only(leg)
    _rows(leg, lambda r: r.update({"tica/n_tokens": 0}))
    assert_no_pass(judge(E.FORWARD, questions[E.FORWARD], legs, candidate), "0 tokens compared")


@pytest.mark.parametrize("key,value", [("tica/logprob_abs_diff_max", 0.25), ("rollout_corr/k3_kl", 0.1),
                                       ("training/rollout_actor_probs_pearson_corr", 0.5)])
def test_logged_numbers_that_contradict_the_arrays_are_named(bound, candidate, questions, key, value):
    legs = bound(E.FORWARD)
    _rows(leg_of(legs, arm="bi1"), lambda r: r.update({key: value}))
    assert_no_pass(judge(E.FORWARD, questions[E.FORWARD], legs, candidate), "its arrays give",
                   "the receipt contradicts itself")


@pytest.mark.parametrize("value", [False, True, "0"])
def test_a_logged_diff_of_another_json_type_is_malformed(bound, candidate, questions, value):
    legs = bound(E.FORWARD)
    leg = leg_of(legs, arm="bi1")
    _logged_only(leg)
    _rows(leg, lambda r: r.update({"training/rollout_probs_diff_max": value, "training/rollout_probs_diff_mean": value}))
    assert_no_pass(judge(E.FORWARD, questions[E.FORWARD], legs, candidate), "rollout_probs_diff_max")


def test_a_bi0_mean_that_is_not_a_number_fails(bound, candidate, questions):
    legs = bound(E.FORWARD)
    leg = leg_of(legs, arm="bi0")
    _logged_only(leg)
    _rows(leg, lambda r: r.update({"training/rollout_probs_diff_mean": float("nan")}))
    assert_no_pass(judge(E.FORWARD, questions[E.FORWARD], legs, candidate), "BI=0 mean is nan")


def test_negative_sequence_lengths_are_refused(bound, candidate, questions):
    legs = bound(E.FORWARD)
    leg = leg_of(legs, arm="bi1")
    path = sorted((leg / "arrays").glob("*.npz"))[0]
    data = dict(np.load(path))
    n = int(data["seq_lens"].sum())
    data["seq_lens"] = np.array([n + 4, -4], dtype=np.int32)
    np.savez(path, **data)
    seal_leg(leg)
    assert_no_pass(judge(E.FORWARD, questions[E.FORWARD], legs, candidate), "seq_lens", "negative")


# ----------------------------------------------------------------------------------- backward, update
def test_more_nonzero_gradients_than_parameters_with_one_is_malformed(bound, candidate, questions):
    legs = bound(E.BACKWARD)
    for leg in legs:
        _rows(leg, lambda r: r.update(params_nonzero_grad=99))
    assert_no_pass(judge(E.BACKWARD, questions[E.BACKWARD], legs, candidate), "params_nonzero_grad 99")


def test_a_grad_norm_of_another_json_type_is_malformed(bound, candidate, questions):
    legs = bound(E.BACKWARD)
    for leg in legs:
        _rows(leg, lambda r: r.update({"actor/grad_norm": True}))
    assert_no_pass(judge(E.BACKWARD, questions[E.BACKWARD], legs, candidate), "grad_norm")


def test_more_tensors_changed_than_the_model_has_is_malformed(bound, candidate, questions):
    legs = bound(E.UPDATE)
    _rows(legs[0], lambda r: r.update(weights_changed_tensors=30, weights_total_tensors=24))
    assert_no_pass(judge(E.UPDATE, questions[E.UPDATE], legs, candidate), "weights_changed_tensors 30")


# ----------------------------------------------------------------------------------- quality
def test_a_summary_that_contradicts_the_results_is_named(bound, candidate, questions):
    legs = bound(E.QUALITY)
    leg = leg_of(legs, arm="bi1")
    (leg / "summary.json").write_text(json.dumps({"greedy": {"correct": 3, "n": 30, "score": 0.1, "truncated": 0}}))
    seal_leg(leg)
    assert_no_pass(judge(E.QUALITY, questions[E.QUALITY], legs, candidate), "summary.json says correct=3",
                   "contradicts itself")


def test_a_summary_that_counts_the_results_passes(bound, candidate, questions):
    """The negative control of the test above: a summary.json that agrees changes nothing."""
    legs = bound(E.QUALITY)
    for leg in legs:
        rows = [json.loads(line) for line in (leg / "results.jsonl").read_text().splitlines() if line.strip()]
        ok = sum(r["correct"] for r in rows)
        summary = {"greedy": {"correct": ok, "n": len(rows), "score": ok / len(rows),
                              "truncated": sum(bool(r.get("truncated")) for r in rows)}}
        (leg / "summary.json").write_text(json.dumps(summary))
        seal_leg(leg)
    cell = judge(E.QUALITY, questions[E.QUALITY], legs, candidate)
    assert cell.verdict is Verdict.PASS, cell.reasons


@pytest.mark.parametrize("value", ["false", 1])
def test_a_correct_flag_of_another_json_type_is_malformed(bound, candidate, questions, value):
    legs = bound(E.QUALITY)
    _rows(leg_of(legs, arm="bi1"), lambda r: r.update(correct=value), "results.jsonl")
    assert_no_pass(judge(E.QUALITY, questions[E.QUALITY], legs, candidate), "correct")


# ----------------------------------------------------------------------------------- throughput
@pytest.mark.parametrize("key,value", [("completed", True), ("num_prompts", True), ("output_throughput", "1013.5")])
def test_a_bench_count_or_rate_of_another_json_type_is_malformed(bound, candidate, questions, key, value):
    from tica.canaries import edit_json, tput_leg

    legs = bound(E.THROUGHPUT)
    leg = tput_leg(legs, "bi1", 8, 1)
    edit_json(leg / "bench.json", lambda b: b.update({key: value}), leg)
    assert_no_pass(judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate), key)


def _tput_legs(legs, arm=None):
    return [leg for leg in legs if arm is None or json.loads((leg / "leg.json").read_text())["arm"] == arm]


@pytest.mark.parametrize("key,value", [("request_rate", 0.05), ("model_id", "/ckpt/qwen3-8b-fp8"),
                                       ("endpoint_type", "openai-chat"), ("burstiness", 0.5)])
def test_a_baseline_run_under_other_bench_settings_is_not_paired(bound, candidate, questions, key, value):
    """BI=0 at 0.05 requests/s (a throttled baseline, honestly slower), or against another model or
    endpoint: a run setting differs, not the switch."""
    from tica.canaries import edit_json, scale_throughput

    legs = bound(E.THROUGHPUT)
    for leg in _tput_legs(legs, "bi0"):
        edit_json(leg / "bench.json", lambda b: b.update({key: value}), leg)
        scale_throughput(leg, 0.8)
    assert_no_pass(judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate), f"bench.{key} differs")


def test_a_bench_result_dated_outside_its_legs_work_is_another_runs(bound, candidate, questions):
    from tica.canaries import edit_json, tput_leg

    legs = bound(E.THROUGHPUT)
    leg = tput_leg(legs, "bi1", 8, 1)
    edit_json(leg / "bench.json", lambda b: b.update(date="20250101-000000"), leg)
    assert_no_pass(judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate), "dated 20250101-000000",
                   "the result of another run")


def test_a_bench_result_dated_in_another_zone_than_utc_is_still_its_legs(bound, candidate, questions):
    """The negative control of the test above: vLLM stamps local time; UTC+14 is still this run."""
    import datetime as dt

    from tica.canaries import edit_json

    legs = bound(E.THROUGHPUT)
    for leg in _tput_legs(legs):
        def shift(b):
            t = dt.datetime.strptime(b["date"], "%Y%m%d-%H%M%S") + dt.timedelta(hours=14)
            b["date"] = t.strftime("%Y%m%d-%H%M%S")
        edit_json(leg / "bench.json", shift, leg)
    cell = judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate)
    assert cell.verdict is Verdict.PASS, cell.reasons


def test_a_leg_that_ends_before_it_starts_is_no_measurement(bound, candidate, questions):
    import datetime as dt

    from tica.canaries import tput_leg

    legs = bound(E.THROUGHPUT)
    leg = tput_leg(legs, "bi0", 8, 1)

    def backwards(m):
        m["ended_at"] = (dt.datetime.fromisoformat(m["started_at"]) - dt.timedelta(hours=1)).isoformat()
    edit_meta(leg, backwards)
    assert_no_pass(judge(E.THROUGHPUT, questions[E.THROUGHPUT], legs, candidate), "contradict themselves")


@pytest.mark.parametrize("key,value", [("completed", True), ("num_prompts", True), ("output_throughput", "1013.5"),
                                       ("failed", False)])
def test_the_bench_model_itself_refuses_another_json_type(key, value):
    """The judge-level test above is refused by the workload check as well; this one shows the
    reading itself converts nothing (its negative control: vLLM's own file, and a num_prompts
    label vLLM wrote as text, are read)."""
    from pydantic import ValidationError

    from tica.receipts import BenchResult

    from .conftest import H200

    data = json.loads((H200 / "run2" / "throughput_bi1_r1_c32" / "bench.json").read_text())
    assert BenchResult.model_validate(data).completed == data["completed"]
    assert BenchResult.model_validate({**data, "num_prompts": str(data["num_prompts"])}).num_prompts == data["num_prompts"]
    with pytest.raises(ValidationError):
        BenchResult.model_validate({**data, key: value})
