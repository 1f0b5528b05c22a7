"""False passes of issue 27 ("a pass only from content"), one test per class closed, each with its
negative control. Every test starts from a set that passes for the candidate (the `bound`
fixture checks that first) and changes one thing, resealed as an honest-looking producer would.
The generated families over every item live in tests/metamorphic/."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from tica.canaries import drop_arrays_keep_digests, edit_json, edit_jsonl, edit_meta, tput_leg
from tica.judges import judge, judge_criteria
from tica.question import parse_question
from tica.seal import seal_leg
from tica.unknowns import PLACEHOLDERS, is_placeholder, without_placeholders
from tica.verdict import Verdict

from .conftest import E, assert_no_pass, leg_of, question_with

_EXAMPLES = settings(max_examples=30, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _targets(q):
    return sorted((q.criteria.budget or {}).keys()) or list(q.criteria.concurrencies)


# ------------------------------------------------------------------ 1. identity by content


def test_quality_problems_relabelled_under_new_ids_are_one_problem_each(bound, candidate, questions):
    """Doubling every problem under new ids would make 1/N fine enough for a 2-point threshold."""
    q = question_with(questions[E.QUALITY], {"threshold_points": 2.0, "expected_problems": 60})
    legs = bound(E.QUALITY, questions[E.QUALITY])
    for leg in legs:
        edit_jsonl(leg / "results.jsonl", lambda rows: rows + [{**r, "problem_id": r["problem_id"] + "-copy"}
                                                                for r in rows], leg)
    cell = judge(E.QUALITY, q, legs, candidate)
    assert_no_pass(cell, "one problem counted several times")


def test_quality_problems_with_distinct_prompts_are_distinct_problems(bound, candidate, questions):
    """Negative control: the same 60 rows with their own prompts pass the 2-point threshold."""
    q = question_with(questions[E.QUALITY], {"threshold_points": 2.0, "expected_problems": 60})
    legs = bound(E.QUALITY, questions[E.QUALITY])
    for leg in legs:
        edit_jsonl(leg / "results.jsonl", lambda rows: rows + [
            {**r, "problem_id": r["problem_id"] + "-b", "prompt_hash": f"sha256:{i + 1000:064x}"}
            for i, r in enumerate(rows)], leg)
    assert judge(E.QUALITY, q, legs, candidate).verdict is Verdict.PASS


def test_a_quality_problem_without_its_prompt_hash_is_not_counted_as_shown(bound, candidate, questions):
    legs = bound(E.QUALITY)
    edit_jsonl(legs[0] / "results.jsonl", lambda rows: [{k: v for k, v in r.items() if k != "prompt_hash"}
                                                        if i == 3 else r for i, r in enumerate(rows)], legs[0])
    assert_no_pass(judge(E.QUALITY, questions[E.QUALITY], legs, candidate), "record no prompt_hash")


def test_one_prompt_spelled_two_ways_pairs_as_one_prompt(bound, candidate, questions):
    """Digest case and prefix are spelling: the same problem in both arms is still paired."""
    legs = bound(E.QUALITY)
    bi0 = leg_of(legs, arm="bi0")
    edit_jsonl(bi0 / "results.jsonl", lambda rows: [{**r, "prompt_hash": r["prompt_hash"].removeprefix("sha256:").upper()}
                                                    for r in rows], bi0)
    assert judge(E.QUALITY, questions[E.QUALITY], legs, candidate).verdict is Verdict.PASS


def test_a_forward_step_copied_under_another_step_number_is_one_measurement(bound, candidate, questions):
    q = question_with(questions[E.FORWARD], {"min_steps": 6})
    legs = bound(E.FORWARD, questions[E.FORWARD])
    leg = leg_of(legs, arm="bi1")
    shutil.copy(leg / "arrays" / "step_0005.npz", leg / "arrays" / "step_0006.npz")
    edit_jsonl(leg / "metrics.jsonl", lambda rows: rows + [{**rows[-1], "step": 6}], leg)
    assert_no_pass(judge(E.FORWARD, q, legs, candidate), "hold one measurement")


def test_a_forward_step_measured_anew_is_another_step(bound, candidate, questions):
    """Negative control: step 6 scores other tokens (bitwise equal, as BI=1 must)."""
    from tica.metrics import forward_metrics
    q = question_with(questions[E.FORWARD], {"min_steps": 6})
    legs = bound(E.FORWARD, questions[E.FORWARD])
    leg = leg_of(legs, arm="bi1")
    with np.load(leg / "arrays" / "step_0005.npz") as z:
        data = {k: z[k] for k in z.files}
    data["token_ids"] = data["token_ids"] + 1
    np.savez(leg / "arrays" / "step_0006.npz", **data)
    m = forward_metrics(data["trainer_logprobs"], data["rollout_logprobs"])
    edit_jsonl(leg / "metrics.jsonl", lambda rows: rows + [{**rows[-1], **m, "step": 6}], leg)
    cell = judge(E.FORWARD, q, [leg], candidate)
    assert cell.verdict is Verdict.PASS, cell.reasons


@_EXAMPLES
@given(data=st.data())
def test_a_logged_only_step_copied_under_any_label_is_one_measurement(bound, candidate, questions, data):
    """Generated: the BI=1 receipt logged only (content digests kept, no arrays), one step short of
    the question; any step copied under any new step number and checkpoint, with or without a
    step basis, fills the gap: never a pass, whatever the copy's labels."""
    q = question_with(questions[E.FORWARD], {"min_steps": 6})
    legs = bound(E.FORWARD, questions[E.FORWARD])
    leg = leg_of(legs, arm="bi1")
    drop_arrays_keep_digests(leg, leg)
    src = data.draw(st.integers(1, 5), label="copied step")
    checkpoint = data.draw(st.one_of(st.just(None), st.text("0123456789abcdef", min_size=8, max_size=64)
                                     .map(lambda h: "sha256:" + h)), label="checkpoint")
    basis = data.draw(st.sampled_from([None, "rollout", "optimizer"]), label="basis")

    def copy(rows):
        row = {**next(r for r in rows if r["step"] == src), "step": 6}
        for key, value in (("checkpoint_version", checkpoint), ("step_basis", basis)):
            if value is not None:
                row[key] = value
        return rows + [row]
    edit_jsonl(leg / "metrics.jsonl", copy, leg)
    note(f"step {src} copied as step 6, checkpoint {checkpoint}, basis {basis}")
    # a copy under the file's own basis is one measurement; under another, the file mixes bases
    assert_no_pass(judge(E.FORWARD, q, [leg], candidate), pattern="hold one measurement|one file, one basis")


def test_a_logged_only_step_of_its_own_content_is_another_step(bound, candidate, questions):
    """Negative control: step 6 logged with the digest of other content passes."""
    q = question_with(questions[E.FORWARD], {"min_steps": 6})
    legs = bound(E.FORWARD, questions[E.FORWARD])
    leg = leg_of(legs, arm="bi1")
    drop_arrays_keep_digests(leg, leg)
    edit_jsonl(leg / "metrics.jsonl", lambda rows: rows + [{**rows[-1], "step": 6,
                                                            "tica/content_sha256": "sha256:" + "6" * 64}], leg)
    cell = judge(E.FORWARD, q, [leg], candidate)
    assert cell.verdict is Verdict.PASS, cell.reasons


def test_a_logged_only_bi1_step_without_its_content_digest_is_no_pass(bound, candidate, questions):
    """All-zero logged numbers are what every passing BI=1 step records: without arrays or a
    digest nothing tells the step from a copy."""
    legs = bound(E.FORWARD)
    leg = leg_of(legs, arm="bi1")
    shutil.rmtree(leg / "arrays")
    seal_leg(leg)
    assert_no_pass(judge(E.FORWARD, questions[E.FORWARD], legs, candidate), "content digest")


def test_a_logged_digest_its_arrays_do_not_give_is_no_pass(bound, candidate, questions):
    legs = bound(E.FORWARD)
    leg = leg_of(legs, arm="bi1")
    edit_jsonl(leg / "metrics.jsonl", lambda rows: [{**r, "tica/content_sha256": "sha256:" + "0" * 64} if r["step"] == 2
                                                    else r for r in rows], leg)
    assert_no_pass(judge(E.FORWARD, questions[E.FORWARD], legs, candidate), "is not its arrays'")


def test_a_throughput_leg_relabelled_as_another_round_is_one_run(bound, candidate, questions):
    q = questions[E.THROUGHPUT]
    legs = bound(E.THROUGHPUT)
    c = _targets(q)[0]
    src, dst = tput_leg(legs, "bi1", c, 1), tput_leg(legs, "bi1", c, 3)
    bench = json.loads((src / "bench.json").read_text())
    edit_json(dst / "bench.json", lambda d: d.update({k: v for k, v in bench.items()
                                                      if k not in ("arm", "round", "slot")}), dst)
    assert_no_pass(judge(E.THROUGHPUT, q, legs, candidate), "one measurement counted")


# ------------------------------------------------------------------ 2. time, every item, every format


@pytest.mark.parametrize("item", [E.FORWARD, E.BACKWARD, E.UPDATE, E.QUALITY, E.CLEAN_EXIT])
def test_a_leg_that_ends_before_it_starts_is_no_pass_for_any_item(bound, candidate, questions, item):
    legs = bound(item)
    edit_meta(legs[0], lambda m: m.update(ended_at="2001-01-01T00:00:00+00:00"))
    assert_no_pass(judge(item, questions[item], legs, candidate), "is before started_at")


@pytest.mark.parametrize("item", [E.FORWARD, E.QUALITY, E.CLEAN_EXIT])
def test_a_leg_naming_one_time_with_a_zone_and_one_without_is_no_pass(bound, candidate, questions, item):
    legs = bound(item)
    edit_meta(legs[0], lambda m: m.update(ended_at=m["ended_at"].replace("+00:00", "")))
    assert_no_pass(judge(item, questions[item], legs, candidate), "cannot be ordered")


@pytest.mark.parametrize("spell", [lambda t: t.replace("+00:00", "Z"),
                                   lambda t: t.replace("+00:00", ".000000+00:00") if "." not in t else t],
                         ids=["Z", "microseconds"])
def test_another_spelling_of_the_same_instant_keeps_the_pass(bound, candidate, questions, spell):
    """Negative control of the time rules: the same instants spelled another way."""
    legs = bound(E.FORWARD)
    for leg in legs:
        edit_meta(leg, lambda m: m.update(started_at=spell(m["started_at"]), ended_at=spell(m["ended_at"])))
    assert judge(E.FORWARD, questions[E.FORWARD], legs, candidate).verdict is Verdict.PASS


def test_throughput_slots_in_mixed_time_formats_are_named_not_a_traceback(bound, candidate, questions):
    q = questions[E.THROUGHPUT]
    legs = bound(E.THROUGHPUT)
    c = _targets(q)[0]
    leg = tput_leg(legs, q.round_arms(1)[0], c, 1)
    edit_meta(leg, lambda m: m.update(started_at=m["started_at"][:19], ended_at=m["ended_at"][:19]))
    assert_no_pass(judge(E.THROUGHPUT, q, legs, candidate), "order of the slots cannot be shown")


# ------------------------------------------------------------------ 3. unknown spelled as a value


def test_the_placeholder_list_is_read_one_way():
    assert all(is_placeholder(p.upper()) and is_placeholder(f" {p} ") for p in PLACEHOLDERS if p)
    assert not any(is_placeholder(v) for v in ("\n", " ", "none", "NONE", "off", "0", "false"))
    assert without_placeholders({"a": "n/a", "b": ["x", "unknown"], "c": {"d": ""}}) == {"b": ["x", None], "c": {}}


def test_none_and_white_space_are_values_only_where_a_setting_or_model_text_takes_them():
    read = without_placeholders({"torch": "none", "commit": " ", "cudagraph_mode": "NONE", "until": ["\n", " "],
                                 "sampling": {"stop": ["none"]}, "checkpoint_version": "None"})
    assert read == {"cudagraph_mode": "NONE", "until": ["\n", " "], "sampling": {"stop": ["none"]}}


@pytest.mark.parametrize("placeholder", ["unknown", "n/a", "", "?"])
def test_equal_placeholders_in_both_arms_are_not_the_same_contract_item(bound, candidate, questions, placeholder):
    legs = bound(E.QUALITY)
    for leg in legs:
        edit_json(leg / "contract.json", lambda d: d.update(scorer=placeholder), leg)
    # the criteria alone (the manifest's pin would also catch it, which hid the class)
    assert_no_pass(judge_criteria(E.QUALITY, questions[E.QUALITY], legs), "evaluation contract item unknown: scorer")


@pytest.mark.parametrize("placeholder", ["unknown", "N/A"])
def test_a_placeholder_does_not_satisfy_a_field_the_question_requires(bound, candidate, questions, placeholder):
    legs = bound(E.BACKWARD)
    edit_meta(legs[0], lambda m: m["versions"].update(vllm=placeholder))
    assert_no_pass(judge_criteria(E.BACKWARD, questions[E.BACKWARD], legs), "versions.vllm not recorded")


def test_a_bench_setting_one_arm_does_not_record_is_not_alike(bound, candidate, questions):
    q = questions[E.THROUGHPUT]
    legs = bound(E.THROUGHPUT)
    for leg in legs:
        if json.loads((leg / "leg.json").read_text())["arm"] == "bi0":
            edit_json(leg / "bench.json", lambda d: d.pop("request_rate"), leg)
    assert_no_pass(judge(E.THROUGHPUT, q, legs, candidate), "bench.request_rate differs")


# ------------------------------------------------------------------ 6. per-leg rules


def test_one_legs_exits_never_cover_another_legs_missing_ones(bound, candidate, questions):
    legs = bound(E.CLEAN_EXIT)
    leg = legs[0]
    arm = json.loads((leg / "leg.json").read_text())["arm"]
    twin = leg.parent / (leg.name + "-second")
    shutil.copytree(leg, twin)
    edit_meta(twin, lambda m: m.update(processes=[p for p in m["processes"] if p["role"] != "engine_core"]))
    assert json.loads((twin / "leg.json").read_text())["arm"] == arm
    assert_no_pass(judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], [*legs, twin], candidate), "roles ['engine_core']")


def test_a_second_leg_with_every_exit_of_its_own_keeps_the_pass(bound, candidate, questions):
    """Negative control: the same second leg, its engine's exit recorded (its own pids)."""
    legs = bound(E.CLEAN_EXIT)
    twin = legs[0].parent / (legs[0].name + "-second")
    shutil.copytree(legs[0], twin)
    edit_meta(twin, lambda m: [p.update(pid=p["pid"] + 500, identity=_anew(p["identity"], 3600.0))
                               for p in m["processes"]])
    assert judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], [*legs, twin], candidate).verdict is Verdict.PASS


# ------------------------------------------------------------------ 1. identity by content: process exits
# A role is covered by an exit of its own process, known by content (its create time, name and
# command line as the producer read them from it), never by a copy of another exit under its name.

_ROLES = ("client", "api_server", "engine_core", "worker")


def _anew(identity: dict, seconds: float) -> dict:
    """Another process's identity: created `seconds` later (a copy keeps the create time)."""
    return {**identity, "create_time": round(identity["create_time"] + seconds, 2)}


def _exits(leg) -> list[dict]:
    return json.loads((leg / "leg.json").read_text())["processes"]


@_EXAMPLES
@given(data=st.data())
def test_any_exit_copied_under_a_missing_role_never_passes(bound, candidate, questions, data):
    """Generated: one leg loses every exit of one role; any exit of any leg (its own, the other
    arm's) is copied under that role with any pid, name, command and evidence, its identity kept
    whole or with fields dropped (a dropped create time makes it unknown). Never a pass."""
    legs = bound(E.CLEAN_EXIT)  # a fresh set for each example (checked to pass first)
    target = data.draw(st.sampled_from(legs), label="leg")
    role = data.draw(st.sampled_from(_ROLES), label="missing role")
    edit_meta(target, lambda m: m.update(processes=[p for p in m["processes"] if p["role"] != role]))
    source_leg = data.draw(st.sampled_from(legs), label="copied from leg")
    source = dict(data.draw(st.sampled_from(_exits(source_leg)), label="copied exit"))
    source["role"] = role
    source["pid"] = data.draw(st.one_of(st.integers(1, 2**22), st.just(source["pid"]), st.none()), label="pid")
    for key, values in (("name", st.sampled_from([None, "VLLM::EngineCore", "VLLM::Worker_TP0", "vllm", role])),
                        ("command", st.sampled_from([None, ["vllm", "serve", "/ckpt/qwen3-8b"], ["python", "-m", role]])),
                        ("evidence", st.sampled_from([None, "exited 0 after SIGTERM", f"{role} ended on its own"]))):
        if data.draw(st.booleans(), label=f"relabel {key}"):
            value = data.draw(values, label=key)
            source.pop(key, None) if value is None else source.update({key: value})
    kept = data.draw(st.sets(st.sampled_from(["create_time", "name", "cmdline"])), label="identity fields dropped")
    identity = {k: v for k, v in source["identity"].items() if k not in kept}
    source.pop("identity") if not identity else source.update(identity=identity)
    edit_meta(target, lambda m: m["processes"].append(source))
    note(f"{target.name}: {role} <- {source}")
    cell = judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, candidate)
    assert_no_pass(cell, role)


@_EXAMPLES
@given(data=st.data())
def test_an_exit_of_its_own_process_under_any_pid_keeps_the_pass(bound, candidate, questions, data):
    """Negative control: the role's exit replaced by one of another process (its own create time),
    under any pid and label, still passes."""
    legs = bound(E.CLEAN_EXIT)  # a fresh set for each example (checked to pass first)
    target = data.draw(st.sampled_from(legs), label="leg")
    role = data.draw(st.sampled_from(_ROLES), label="role")
    later = data.draw(st.floats(3600.0, 86400.0), label="created later by")
    pid = data.draw(st.integers(1, 2**22), label="pid")
    name = data.draw(st.sampled_from([None, "VLLM::EngineCore", "python3"]), label="name")

    def replace(m):
        for p in m["processes"]:
            if p["role"] == role:
                p.update(pid=pid, identity=_anew(p["identity"], later) | ({"name": name} if name else {}))
    edit_meta(target, replace)
    cell = judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, candidate)
    assert cell.verdict is Verdict.PASS, cell.reasons


def test_an_exit_without_its_process_identity_is_no_pass_for_its_role(bound, candidate, questions):
    legs = bound(E.CLEAN_EXIT)
    edit_meta(legs[0], lambda m: [p.pop("identity") for p in m["processes"] if p["role"] == "engine_core"])
    assert_no_pass(judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, candidate), "['engine_core']",
                   "record no process identity")


def test_one_worker_copied_under_another_pid_is_not_a_second_worker(bound, candidate, questions):
    """A server of 2 GPU workers: worker 0's exit copied under a new pid is one worker."""
    legs = bound(E.CLEAN_EXIT)

    def tp2(m, own: bool):
        m["resolved_config"].update(tensor_parallel_size=2)
        w = next(p for p in m["processes"] if p["role"] == "worker")
        m["processes"].append({**w, "pid": w["pid"] + 1, **({"identity": _anew(w["identity"], 0.5)} if own else {})})
    for leg in legs:
        edit_meta(leg, lambda m: tp2(m, own=False))
    # the criteria alone: the candidate pins TP 1
    assert_no_pass(judge_criteria(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs), "so it shows at most one of them ended")


def test_two_workers_of_their_own_processes_pass(bound, candidate, questions):
    legs = bound(E.CLEAN_EXIT)
    for leg in legs:
        def tp2(m):
            m["resolved_config"].update(tensor_parallel_size=2)
            w = next(p for p in m["processes"] if p["role"] == "worker")
            m["processes"].append({**w, "pid": w["pid"] + 1, "identity": _anew(w["identity"], 0.5)})
        edit_meta(leg, tp2)
    cell = judge_criteria(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs)
    assert cell.verdict is Verdict.PASS, cell.reasons


_SERVER_ROLES = ("api_server", "engine_core", "worker")


def _round_legs(legs, arm: str) -> dict[tuple[int, int], object]:
    """(round, concurrency) -> the throughput leg of `arm`."""
    out = {}
    for leg in legs:
        m = json.loads((leg / "leg.json").read_text())
        if m["arm"] == arm:
            out[(m["round"], m["concurrency"])] = leg
    return out


def _serve_from(src, dest) -> None:
    """dest's server exits replaced by copies of src's (the client's stays dest's own)."""
    theirs = [p for p in _exits(src) if p["role"] in _SERVER_ROLES]
    edit_meta(dest, lambda m: m.update(processes=[p for p in m["processes"] if p["role"] not in _SERVER_ROLES] + theirs))


def test_a_server_exit_copied_into_another_round_is_not_that_rounds_server(bound, questions):
    """Each round starts its own server: round 1's server exits copied into a round 2 leg show
    round 1's server only, and round 2's is unverified."""
    legs = bound(E.THROUGHPUT)
    assert judge_criteria(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs).verdict is Verdict.PASS  # control
    by = _round_legs(legs, "bi1")
    c = min(c for _, c in by)
    _serve_from(by[(1, c)], by[(2, c)])
    assert_no_pass(judge_criteria(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs), "so it shows at most one of them ended")


def test_legs_of_one_round_share_its_server_exits(bound, questions):
    """Negative control: one server serves every concurrency of a round and arm, so the legs of
    one round recording the same server exits still pass."""
    legs = bound(E.THROUGHPUT)
    by = _round_legs(legs, "bi1")
    cs = sorted({c for r, c in by if r == 1})
    assert len(cs) > 1
    _serve_from(by[(1, cs[0])], by[(1, cs[1])])
    cell = judge_criteria(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs)
    assert cell.verdict is Verdict.PASS, cell.reasons


def _alive(leg, roles, *, shift_read_s: float = 5.0) -> list[dict]:
    """`alive_at_end` entries for the leg's exits of `roles`: each process read alive `shift_read_s`
    after the leg's work ended (negative: before it ended)."""
    import datetime as dt

    m = json.loads((leg / "leg.json").read_text())
    read = (dt.datetime.fromisoformat(m["ended_at"]) + dt.timedelta(seconds=shift_read_s)).isoformat()
    return [{"role": p["role"], "pid": p["pid"], "identity": p["identity"], "read_at": read}
            for p in m["processes"] if p["role"] in roles]


def _one_server_all_rounds(legs, arm: str = "bi1", **alive) -> list:
    """Every `arm` leg served by round 1's first leg's server (one process through every round, as on
    the GPU), each leg reading those processes alive after its work. Returns the arm's legs."""
    by = _round_legs(legs, arm)
    first = by[min(by)]
    for key, leg in by.items():
        if leg != first:
            _serve_from(first, leg)
    for leg in by.values():
        entries = _alive(leg, _SERVER_ROLES, **alive)
        edit_meta(leg, lambda m, e=entries: m.update(alive_at_end=e))
    return list(by.values())


def test_one_server_read_alive_through_every_round_stands_for_each_rounds_server(bound, questions):
    """One server process through every round of an arm (as the GPU runs serve), read alive at the end
    of each leg it served: its one clean exit is each round's server exit."""
    legs = bound(E.THROUGHPUT)
    _one_server_all_rounds(legs)
    cell = judge_criteria(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs)
    assert cell.verdict is Verdict.PASS, cell.reasons


def _drop_first(leg) -> None:
    edit_meta(leg, lambda m: m.update(alive_at_end=m["alive_at_end"][1:]))


def _older_identity(leg) -> None:
    edit_meta(leg, lambda m: [e.update(identity=_anew(e["identity"], 1.0)) for e in m["alive_at_end"]])


def _another_pid(leg) -> None:
    edit_meta(leg, lambda m: [e.update(pid=e["pid"] + 1) for e in m["alive_at_end"]])


def _another_role(leg) -> None:
    edit_meta(leg, lambda m: [e.update(role="client") for e in m["alive_at_end"]])


def _started_before_the_server(leg) -> None:
    import datetime as dt

    def early(m):
        created = min(p["identity"]["create_time"] for p in m["processes"] if p["role"] in _SERVER_ROLES)
        m["started_at"] = dt.datetime.fromtimestamp(created - 60, dt.timezone.utc).isoformat()
    edit_meta(leg, early)


def _no_times(leg) -> None:
    edit_meta(leg, lambda m: m.update(started_at=None))


# Metamorphic: from the passing set above, any one change that stops a leg showing the process ran
# through it (its live read missing, read before the leg ended, of another process, pid or role, or
# a leg that began before the process existed) turns the shared exit back into a copy: never a pass.
@pytest.mark.parametrize("change", [_drop_first, _older_identity, _another_pid, _another_role,
                                    _started_before_the_server, _no_times])
def test_a_leg_that_does_not_show_the_shared_server_ran_through_it_is_no_pass(bound, questions, change):
    legs = bound(E.THROUGHPUT)
    served = _one_server_all_rounds(legs)
    change(served[-1])
    assert_no_pass(judge_criteria(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs), "so it shows at most one of them ended")


def test_a_live_read_before_the_leg_ended_is_no_pass(bound, questions):
    legs = bound(E.THROUGHPUT)
    _one_server_all_rounds(legs, shift_read_s=-1.0)
    assert_no_pass(judge_criteria(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs), "so it shows at most one of them ended")


def test_one_server_read_alive_in_both_arms_is_still_one_arms_server(bound, questions):
    """A server runs under one arm's switch: read alive in the other arm's legs too, its exit still
    never covers that arm's server."""
    legs = bound(E.THROUGHPUT)
    served = _one_server_all_rounds(legs, "bi1")
    other = _round_legs(legs, "bi0")
    for leg in other.values():
        _serve_from(served[0], leg)
        entries = _alive(leg, _SERVER_ROLES)
        edit_meta(leg, lambda m, e=entries: m.update(alive_at_end=e))
    assert_no_pass(judge_criteria(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs), "so it shows at most one of them ended")


def test_one_bench_client_read_alive_through_both_arms_stands_for_each(bound, questions):
    """The client carries no arm's switch: one client process that ran every leg of both arms, read
    alive at each leg's end, is each leg's client; without those reads it is a copy."""
    legs = bound(E.THROUGHPUT)
    first = legs[0]
    client = [p for p in _exits(first) if p["role"] == "client"]
    for leg in legs:
        edit_meta(leg, lambda m: m.update(processes=[p for p in m["processes"] if p["role"] != "client"] + client))
    assert_no_pass(judge_criteria(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs), "so it shows at most one of them ended")
    for leg in legs:
        entries = _alive(leg, ("client",))
        edit_meta(leg, lambda m, e=entries: m.update(alive_at_end=e))
    cell = judge_criteria(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs)
    assert cell.verdict is Verdict.PASS, cell.reasons


# ------------------------------------------------------------------ 7. domains


def test_equal_positive_logprobs_are_no_logprobs(bound, candidate, questions):
    legs = bound(E.FORWARD)
    leg = leg_of(legs, arm="bi1")
    path = leg / "arrays" / "step_0001.npz"
    with np.load(path) as z:
        data = {k: z[k] for k in z.files}
    for key in ("trainer_logprobs", "rollout_logprobs", "decode_logprobs"):
        data[key] = np.abs(data[key])
    np.savez(path, **data)
    seal_leg(leg)
    assert_no_pass(judge(E.FORWARD, questions[E.FORWARD], legs, candidate), "a log-probability is at most 0")


@pytest.mark.parametrize("key,value", [("training/rollout_probs_diff_mean", 1.5),
                                       ("training/rollout_actor_probs_pearson_corr", 1.2),
                                       ("rollout_corr/k3_kl", -0.1)])
def test_a_logged_number_outside_its_domain_is_refused(bound, candidate, questions, key, value):
    legs = bound(E.FORWARD)
    leg = leg_of(legs, arm="bi0")
    edit_jsonl(leg / "metrics.jsonl", lambda rows: [{**r, key: value} for r in rows], leg)
    assert_no_pass(judge(E.FORWARD, questions[E.FORWARD], legs, candidate), "no such quantity")


# ------------------------------------------------------------------ pairing order, once


def test_the_planner_reads_arm_a_from_the_question(questions):
    from resources import plan_legs

    data = questions[E.THROUGHPUT].model_dump(mode="json")
    data["criteria"]["arm_a"] = "bi0"
    q = parse_question(data)
    plan = [(s.round, s.slot, s.arm) for s in plan_legs(E.THROUGHPUT, q)]
    assert plan[:4] == [(1, 1, "bi0"), (1, 2, "bi1"), (2, 1, "bi1"), (2, 2, "bi0")]
    # control: the default A is BI=1
    assert [s.arm for s in plan_legs(E.THROUGHPUT, questions[E.THROUGHPUT])][:2] == ["bi1", "bi0"]


# ------------------------------------------------------------------ accounting


@pytest.mark.parametrize("item", list(E))
def test_every_input_of_every_item_is_accounted_for(bound, candidate, questions, item):
    legs = bound(item)
    cell = judge(item, questions[item], legs, candidate)
    assert [i["input"] for i in cell.numbers["inputs"]] == [p.name for p in legs]
    assert {i["fate"] for i in cell.numbers["inputs"]} == {"judged"}, cell.numbers["inputs"]


def test_an_input_a_judge_drops_in_silence_is_no_pass(bound, candidate, questions, monkeypatch):
    import tica.judges as judges

    legs = bound(E.CLEAN_EXIT)
    extra = legs[0].parent / "exit_third"
    shutil.copytree(legs[0], extra)
    real = judges.JUDGES[E.CLEAN_EXIT]
    monkeypatch.setitem(judges.JUDGES, E.CLEAN_EXIT, lambda q, paths: real(q, [p for p in paths if p != extra]))
    cell = judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], [*legs, extra], candidate)
    assert_no_pass(cell, "exit_third named as input(s) but neither judged nor refused")
    # control: the same judge handed only what it reads passes
    assert judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, candidate).verdict is Verdict.PASS


# ------------------------------------------------------------------ 8. named inputs never dropped


@pytest.mark.parametrize("make", [lambda d: (d / "forward_bi0_retry").mkdir(),
                                  lambda d: (d / "forward_bi0.jsonl").write_text("{}\n")],
                         ids=["empty-folder", "other-file"])
def test_an_entry_of_a_receipts_folder_that_is_no_leg_is_refused_by_name(bound, make):
    from tica.errors import ReceiptError
    from tica.judges import expand_receipts

    legs = bound(E.FORWARD)
    folder = legs[0].parent
    assert expand_receipts([folder]) == sorted(legs)  # control: legs alone expand to themselves
    make(folder)
    with pytest.raises(ReceiptError, match="not skipped"):
        expand_receipts([folder])


# ------------------------------------------------------------------ the basis's pilot digests, read


def test_a_pilot_leg_the_basis_was_planned_from_is_no_formal_measurement(bound, candidate, questions):
    from tica.seal import seal_digest

    q = questions[E.THROUGHPUT]
    legs = bound(E.THROUGHPUT)
    assert q.criteria.statistical_basis is not None
    pilot = tput_leg(legs, "bi0", _targets(q)[0], 1)
    data = q.model_dump(mode="json")
    data["criteria"]["statistical_basis"]["pilot_digests"] = [seal_digest(pilot).upper()]  # any spelling
    cell = judge(E.THROUGHPUT, parse_question(data), legs, candidate)
    assert_no_pass(cell, f"{pilot.name} is a pilot leg")
    # control: the basis as frozen names other pilots, and the same legs pass
    assert judge(E.THROUGHPUT, q, legs, candidate).verdict is Verdict.PASS


# ------------------------------------------------------------------ 5. digests in one spelling


def test_an_update_to_the_weights_it_started_from_spelled_in_capitals_changed_nothing(bound, candidate, questions):
    legs = bound(E.UPDATE)
    leg = legs[0]
    start = json.loads((leg / "leg.json").read_text())["resolved_config"]["weights_hash"]
    edit_jsonl(leg / "metrics.jsonl", lambda rows: [{**r, "updated_weights_hash": start.upper()} for r in rows], leg)
    edit_jsonl(leg / "post_forward" / "metrics.jsonl",
               lambda rows: [{**r, "checkpoint_version": start} for r in rows], leg)
    assert_no_pass(judge(E.UPDATE, questions[E.UPDATE], legs, candidate), "nothing was updated")


def test_the_post_update_forward_names_the_updated_weights_in_any_spelling(bound, candidate, questions):
    """Negative control: the same hash, another case, is the same weights."""
    legs = bound(E.UPDATE)
    leg = legs[0]
    edit_jsonl(leg / "post_forward" / "metrics.jsonl",
               lambda rows: [{**r, "checkpoint_version": r["checkpoint_version"].upper()} for r in rows], leg)
    assert judge(E.UPDATE, questions[E.UPDATE], legs, candidate).verdict is Verdict.PASS


# ------------------------------------------------------------------ 7. numbers outside their domain


@pytest.mark.parametrize("key,value", [("resolved_config.gpu_memory_utilization", 1.7),
                                       ("resolved_config.max_model_len", -12288), ("device.count", 0)])
@pytest.mark.parametrize("item", [E.FORWARD, E.CLEAN_EXIT])
def test_a_setting_outside_its_domain_in_every_leg_is_no_pass(bound, candidate, questions, item, key, value):
    legs = bound(item)
    section, name = key.split(".")
    for leg in legs:
        edit_meta(leg, lambda m: m.setdefault(section, {}).update({name: value}))
    assert_no_pass(judge(item, questions[item], legs, candidate), "outside its domain")


# ------------------------------------------------------------------ 6. a per-leg rule: every exit of the server


def test_a_worker_exit_one_leg_left_out_is_not_covered_by_the_other_arm(bound, candidate, questions):
    legs = bound(E.CLEAN_EXIT)
    edit_meta(legs[0], lambda m: m.update(processes=[p for p in m["processes"] if p["role"] != "worker"]))
    assert_no_pass(judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, candidate), "['worker']")


def test_a_tensor_parallel_server_records_every_worker_exit(bound, candidate, questions):
    legs = bound(E.CLEAN_EXIT)
    for leg in legs:
        edit_meta(leg, lambda m: m["resolved_config"].update(tensor_parallel_size=2))
    assert_no_pass(judge(E.CLEAN_EXIT, questions[E.CLEAN_EXIT], legs, candidate), "1 worker exit(s) recorded")
