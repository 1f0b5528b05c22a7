"""Tests that kill the mutants the mutation run (scripts/mutation.sh, docs/mutation.md) found alive:
each pins a behaviour of a public function that no other test pinned. Receipts are the committed
clean-exit set (tests/fixtures/receipts), edited and resealed as tests/judges and tests/false_pass
edit theirs."""

from __future__ import annotations

import datetime as dt
import shutil
import time
from pathlib import Path

import pytest

from tica import leg_times
from tica.canaries import edit_meta
from tica.judges import judge_criteria
from tica.process_exits import ZERO_TIMEOUT_HINT, exit_problem, exit_problems
from tica.question import Question, load_question, parse_question
from tica.receipts import LegMeta, ProcessExit, load_leg
from tica.unknowns import is_unknown, without_placeholders
from tica.verdict import Verdict

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "receipts"
UTC = dt.timezone.utc
START, END = "2026-11-29T10:00:00+00:00", "2026-11-29T10:05:00+00:00"


def _question(item: str, **over) -> Question:
    q = load_question(FIXTURES / "questions" / f"{item}.yaml")
    if not over:
        return q
    data = q.model_dump(mode="json")
    data.update(over)
    return parse_question(data)


Q = _question("clean_exit")


@pytest.fixture
def exit_legs(tmp_path) -> list[Path]:
    """The committed, passing clean-exit set: exit_bi0 (pids 9010-9013), exit_bi1 (9000-9003)."""
    dst = tmp_path / "clean_exit"
    shutil.copytree(FIXTURES / "clean_exit", dst)
    return sorted(dst.iterdir())


def _copy_leg(src: Path, name: str, **meta) -> Path:
    """A further leg made from `src`, its leg.json updated with `meta` and resealed."""
    dst = src.parent / name
    shutil.copytree(src, dst)
    edit_meta(dst, lambda m: m.update(meta))
    return dst


def _roles(leg: Path, *roles: str) -> None:
    edit_meta(leg, lambda m: m.update(processes=[p for p in m["processes"] if p["role"] in roles]))


def _process(leg: Path, role: str, **kv) -> None:
    def f(m):
        next(p for p in m["processes"] if p["role"] == role).update(kv)
    edit_meta(leg, f)


# ------------------------------------------------------------------------------ tica.leg_times
def test_an_unreadable_time_is_named_with_its_key_and_the_other_time_is_still_read():
    assert leg_times.contradictions({"started_at": "yesterday", "ended_at": END}) == [
        "started_at 'yesterday' is not an ISO 8601 time"]
    assert leg_times.contradictions({"started_at": START, "ended_at": 1764410700}) == [
        "ended_at 1764410700 is not an ISO 8601 time"]


@pytest.mark.parametrize("meta", [{"started_at": START}, {"ended_at": END}, {}])
def test_one_recorded_time_alone_contradicts_nothing(meta):
    assert leg_times.contradictions(meta) == []
    assert leg_times.contradictions(meta, "2026-11-29T11:00:00+00:00") == []


def test_a_zero_length_leg_is_no_contradiction_in_any_spelling():
    assert leg_times.contradictions({"started_at": START, "ended_at": "2026-11-29T12:00:00+02:00"}) == []
    assert leg_times.contradictions({"started_at": END, "ended_at": START}) == [
        f"ended_at {START} is before started_at {END}"]


def test_mixed_zones_are_named_in_full():
    assert leg_times.contradictions({"started_at": "2026-11-29T10:00:00", "ended_at": END}) == [
        f"started_at 2026-11-29T10:00:00 and ended_at {END}: one names a time zone and the other does not, "
        "so they cannot be ordered"]


def test_a_leg_that_ended_after_it_was_sealed_contradicts_itself():
    meta = {"started_at": START, "ended_at": END}
    assert leg_times.contradictions(meta, "2026-11-29T10:04:00+00:00") == [
        f"ended_at {END} is after the leg was sealed (2026-11-29T10:04:00+00:00)"]
    assert leg_times.contradictions(meta, "2026-11-29T10:04:00Z") == [
        f"ended_at {END} is after the leg was sealed (2026-11-29T10:04:00Z)"]
    # sealed the moment it ended, or later: no contradiction; no seal time, or an unreadable one: none known
    for sealed in (END, "2026-11-29T12:05:00+02:00", "2026-11-30T00:00:00+00:00", None, "not a time"):
        assert leg_times.contradictions(meta, sealed) == [], sealed


def test_a_leg_with_only_a_start_after_its_seal_names_the_start():
    assert leg_times.contradictions({"started_at": "2026-11-29T10:10:00+00:00"}, "2026-11-29T10:04:00+00:00") == [
        "started_at 2026-11-29T10:10:00+00:00 is after the leg was sealed (2026-11-29T10:04:00+00:00)"]


def test_a_zone_less_end_is_placed_within_14_hours_of_the_seal():
    sealed = "2026-11-29T10:00:00+00:00"
    after = {"started_at": "2026-11-28T19:00:00"}
    # within 14 h either way: undecidable, so no contradiction; more than 14 h after: a contradiction
    for end in ("2026-11-28T20:00:00", "2026-11-29T10:00:00", "2026-11-30T00:00:00"):
        assert leg_times.contradictions({**after, "ended_at": end}, sealed) == [], end
    assert leg_times.contradictions({**after, "ended_at": "2026-11-30T00:00:01"}, sealed) == [
        f"ended_at 2026-11-30T00:00:01 is after the leg was sealed ({sealed})"]
    assert leg_times.contradictions({"started_at": "2026-11-28T10:00:00", "ended_at": "2026-11-28T19:59:59"},
                                    sealed) == []


def test_ordered_is_certain_only_outside_the_14_hour_window():
    p, seal = leg_times.parse, leg_times.parse("2026-11-29T10:00:00+00:00")
    assert leg_times.ordered(p("2026-11-29T10:00:00+00:00"), seal) is True  # equal instants are ordered
    assert leg_times.ordered(p("2026-11-29T12:00:00+02:00"), seal) is True
    assert leg_times.ordered(p("2026-11-29T10:00:01+00:00"), seal) is False
    assert leg_times.ordered(p("2026-11-28T20:00:00"), seal) is True  # latest possible instant: the seal itself
    assert leg_times.ordered(p("2026-11-28T20:00:01"), seal) is None
    assert leg_times.ordered(p("2026-11-30T00:00:00"), seal) is None  # earliest possible instant: the seal itself
    assert leg_times.ordered(p("2026-11-30T00:00:01"), seal) is False
    assert leg_times.ordered(seal, p("2026-11-30T00:00:00")) is True
    assert leg_times.ordered(p("2026-11-29T10:00:00"), p("2026-11-29T10:00:00")) is True
    assert leg_times.ordered(p("2026-11-29T10:00:01"), p("2026-11-29T10:00:00")) is False


@pytest.fixture
def local_zone_not_utc(monkeypatch):
    """The machine's local zone at UTC+05:30, so that reading a time in local time shows."""
    monkeypatch.setenv("TZ", "IST-5:30")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_times_are_read_in_utc_never_in_the_machine_zone(local_zone_not_utc):
    aware = leg_times.parse("2026-11-29T12:00:00+02:00")
    at = dt.datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    assert aware.aware and aware.at == at and aware.at.utcoffset() == dt.timedelta(0)
    assert aware.earliest_utc() == at and aware.latest_utc() == at
    assert aware.earliest_utc().utcoffset() == dt.timedelta(0)
    local = leg_times.parse("2026-11-29T10:00:00")
    assert not local.aware and local.at == dt.datetime(2026, 11, 29, 10, 0) and local.at.tzinfo is None
    assert local.earliest_utc() == dt.datetime(2026, 11, 28, 20, 0, tzinfo=UTC)
    assert local.latest_utc() == dt.datetime(2026, 11, 30, 0, 0, tzinfo=UTC)


def test_a_leg_sealed_before_it_ended_is_no_pass(exit_legs):
    edit_meta(exit_legs[0], lambda m: m.update(ended_at="2099-01-01T00:00:00+00:00"))
    cell = judge_criteria("exit", Q, exit_legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert cell.reasons[0].startswith("inconclusive: exit_bi0: ended_at 2099-01-01T00:00:00+00:00 is after the leg "
                                      "was sealed ("), cell.reasons


# ------------------------------------------------------------------------------ tica.unknowns
def test_a_placeholder_alone_or_in_a_list_becomes_absent():
    assert without_placeholders("n/a") is None and without_placeholders(" Unknown ") is None
    assert without_placeholders("none") == "none" and without_placeholders(0) == 0
    assert without_placeholders(["x", "?", ["tbd", 1]]) == ["x", None, [None, 1]]
    assert without_placeholders({"a": "unknown", "b": ["x", "--"], "c": {"d": "n.a."}}) == {"b": ["x", None], "c": {}}


def test_a_placeholder_is_unknown_and_a_value_is_not():
    for value in (None, "", "n/a", " UNKNOWN ", "not recorded", [], {}, ()):
        assert is_unknown(value), value
    for value in ("none", "\n", 0, False, ["n/a"], {"a": None}):
        assert not is_unknown(value), value


# ------------------------------------------------------------------------------ tica.process_exits
def test_exit_problem_spells_the_end_state_and_the_signal():
    ended = ProcessExit(role="api_server", pid=1, end_state="killed", exit_code=None, signal="SIGTERM")
    assert exit_problem(ended) == "ended killed by signal SIGTERM"
    assert exit_problem(ended.model_copy(update={"end_state": "running", "signal": None})) == "ended running"


def test_exit_problem_reads_a_stop_by_tica_from_the_evidence_and_passes_other_evidence():
    ok = ProcessExit(role="engine_core", pid=1, exit_code=0, end_state="exited")
    stopped = ok.model_copy(update={"evidence": "tica leg run sent SIGTERM after 600 s"})
    assert exit_problem(stopped) == "stopped by tica leg run, not ended by itself: 'tica leg run sent SIGTERM after 600 s'"
    assert exit_problem(ok.model_copy(update={"evidence": "INFO: engine shut down"})) is None


def _meta(leg: Path, processes: list[dict], **update) -> LegMeta:
    meta = load_leg(leg).meta
    return meta.model_copy(update={"processes": tuple(ProcessExit(**p) for p in processes), **update})


CLIENT = {"role": "client", "pid": 9010, "exit_code": 0, "end_state": "exited"}
API = {"role": "api_server", "pid": 9011, "exit_code": 0, "end_state": "exited"}
ENGINE = {"role": "engine_core", "pid": 9012, "exit_code": 0, "end_state": "exited"}
FORCED = "(EngineCore_DP0 pid=9012) Force killing remaining process EngineCore"


def test_exit_problems_name_the_shutdown_timeout_only_for_a_force_killed_engine_core(exit_legs):
    zero = {"kernels": {"rollout": {"shutdown_timeout": 0}}}
    killed = {**ENGINE, "end_state": "force_killed", "exit_code": None}
    assert exit_problems(_meta(exit_legs[0], [CLIENT, API, killed], **zero)) == [
        f"server: engine_core pid 9012 ended force_killed ({ZERO_TIMEOUT_HINT})"]
    forced = {**ENGINE, "evidence": FORCED}
    assert exit_problems(_meta(exit_legs[0], [CLIENT, API, forced], **zero)) == [
        f"server: engine_core pid 9012 force killed: {FORCED!r} ({ZERO_TIMEOUT_HINT})"]
    # an EngineCore that failed otherwise, or another role: no word about the shutdown timeout
    assert exit_problems(_meta(exit_legs[0], [CLIENT, API, {**ENGINE, "exit_code": 1}], **zero)) == [
        "server: engine_core pid 9012 exit code 1"]
    assert exit_problems(_meta(exit_legs[0], [CLIENT, {**API, "exit_code": 1}, ENGINE], **zero)) == [
        "server: api_server pid 9011 exit code 1"]
    thirty = {"resolved_config": {"shutdown_timeout": 30}}
    assert exit_problems(_meta(exit_legs[0], [CLIENT, API, killed], **thirty)) == [
        "server: engine_core pid 9012 ended force_killed (despite a shutdown timeout of 30 s)"]
    assert exit_problems(_meta(exit_legs[0], [CLIENT, API, killed], kernels={}, resolved_config={})) == [
        "server: engine_core pid 9012 ended force_killed"]


def test_exit_problems_name_a_side_never_recorded_beside_a_bad_exit(exit_legs):
    assert exit_problems(_meta(exit_legs[0], [{**API, "exit_code": 1}, ENGINE])) == [
        "client exit not recorded (no client process in processes)", "server: api_server pid 9011 exit code 1"]
    assert exit_problems(_meta(exit_legs[0], [CLIENT, API, ENGINE])) == []


def test_the_passing_cell_reports_every_process_per_side(exit_legs):
    cell = judge_criteria("exit", Q, exit_legs)
    assert cell.verdict is Verdict.PASS, cell.reasons
    assert cell.summary == ("pass: client pass (2 processes), server pass (6 processes), trainer not run "
                            "(0 processes); arms whose legs ran: ['bi0', 'bi1']")
    n = cell.numbers
    assert (n["client"], n["server"], n["trainer"]) == (
        {"verdict": "pass", "processes": 2}, {"verdict": "pass", "processes": 6}, {"verdict": "not run", "processes": 0})
    assert n["arms_verified"] == ["bi0", "bi1"] and len(n["processes"]) == 8
    assert n["processes"][0] == {"leg": "clean_exit bi0 exit_bi0", "side": "client", "role": "client", "pid": 9010,
                                 "end_state": "exited", "exit_code": 0, "signal": None, "evidence": None,
                                 "status": "clean"}
    assert cell.tables["per process"].splitlines()[:3] == [
        "| leg | side | role | pid | end state | exit code | signal | evidence | status |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        "| clean_exit bi0 exit_bi0 | client | client | 9010 | exited | 0 | — | — | clean |"]


def test_a_failed_exit_is_named_by_leg_and_marked_in_the_table(exit_legs):
    _process(exit_legs[0], "client", exit_code=2)
    cell = judge_criteria("exit", Q, exit_legs)
    assert cell.verdict is Verdict.FAIL
    assert cell.reasons[0] == "fail: client: clean_exit bi0 exit_bi0: client pid 9010 exit code 2"
    assert cell.numbers["processes"][0]["status"] == "NOT clean"
    assert cell.numbers["client"]["verdict"] == "fail" and cell.numbers["server"]["verdict"] == "pass"
    assert "| 2 | — | — | NOT clean |" in cell.tables["per process"]


def test_a_question_for_another_item_is_inconclusive_and_says_so(exit_legs):
    forward = _question("forward")
    cell = judge_criteria("exit", forward, exit_legs)
    why = f"question {forward.name!r} is for forward, not clean_exit"
    assert cell.verdict is Verdict.INCONCLUSIVE and cell.item.value == "clean_exit"
    assert cell.question_hash == forward.hash
    assert cell.reasons[0] == f"inconclusive: {why}" and cell.summary == f"inconclusive: {why}"


def test_a_leg_that_did_not_run_is_noted_and_the_legs_after_it_are_still_judged(exit_legs):
    edit_meta(exit_legs[0], lambda m: m.update(not_run_reason="the engine did not start", processes=[]))
    _process(exit_legs[1], "worker", exit_code=1)
    cell = judge_criteria("exit", Q, exit_legs)
    assert cell.verdict is Verdict.FAIL
    assert "note: clean_exit bi0 exit_bi0: did not run (the engine did not start); no exits to verify" in cell.reasons
    assert "fail: server: clean_exit bi1 exit_bi1: worker pid 9003 exit code 1" in cell.reasons


def test_the_exits_a_leg_that_did_not_run_recorded_are_judged(exit_legs):
    edit_meta(exit_legs[0], lambda m: m.update(not_run_reason="the client timed out"))
    _process(exit_legs[0], "engine_core", exit_code=1)
    cell = judge_criteria("exit", Q, exit_legs)
    assert cell.verdict is Verdict.FAIL
    assert "note: clean_exit bi0 exit_bi0: did not run (the client timed out)" in cell.reasons
    assert "fail: server: clean_exit bi0 exit_bi0: engine_core pid 9012 exit code 1" in cell.reasons


def test_a_clean_leg_that_did_not_run_after_one_that_ran_leaves_the_cell_run(exit_legs):
    edit_meta(exit_legs[1], lambda m: m.update(not_run_reason="the client timed out"))
    cell = judge_criteria("exit", Q, exit_legs)
    assert cell.verdict is not Verdict.NOT_RUN, cell.reasons
    assert cell.numbers["arms_verified"] == ["bi0"]


def test_a_leg_without_exits_does_not_hide_a_failure_in_a_later_leg(exit_legs):
    edit_meta(exit_legs[0], lambda m: m.update(processes=[]))
    _process(exit_legs[1], "client", exit_code=1)
    cell = judge_criteria("exit", Q, exit_legs)
    assert cell.verdict is Verdict.FAIL
    assert "inconclusive: clean_exit bi0 exit_bi0: no exit receipt (processes is empty)" in cell.reasons


def test_a_field_the_question_must_record_is_required_of_every_leg(exit_legs):
    edit_meta(exit_legs[0], lambda m: m["versions"].pop("vllm"))
    cell = judge_criteria("exit", _question("clean_exit", must_record=["versions.vllm"]), exit_legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert ("inconclusive: clean_exit bi0 exit_bi0: versions.vllm not recorded (unknown); the question requires it"
            in cell.reasons), cell.reasons


def test_no_legs_and_no_leg_that_ran_are_not_run(exit_legs):
    assert judge_criteria("exit", Q, []).reasons == ("not run: no legs to read exits from",)
    for leg in exit_legs:
        edit_meta(leg, lambda m: m.update(not_run_reason="the engine did not start"))
    cell = judge_criteria("exit", Q, exit_legs)
    assert cell.verdict is Verdict.NOT_RUN
    assert cell.reasons[0] == "not run: no process exit was verified: no leg that ran recorded one"
    assert cell.summary.endswith("; arms whose legs ran: none")


def test_a_served_leg_needs_its_own_exits_whatever_its_arm_recorded(exit_legs):
    """A served leg missing a role is inconclusive even where another leg of its arm recorded
    that role; a leg that served nothing (a trainer's) is held to its arm, not to the server's roles."""
    bi0, bi1 = exit_legs
    trainer = _copy_leg(bi0, "a_trainer_bi0", item="forward",
                        processes=[{"role": "trainer", "pid": 7, "exit_code": 0, "end_state": "exited",
                                    "identity": {"create_time": 1795940000.0, "name": "python3"}}])
    assert judge_criteria("exit", Q, [trainer, bi0, bi1]).verdict is Verdict.PASS
    no_api = _copy_leg(bi0, "exit_bi0_b")
    _roles(no_api, "client", "engine_core", "worker")
    cell = judge_criteria("exit", Q, [trainer, bi0, no_api, bi1])
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert ("inconclusive: clean_exit bi0 exit_bi0_b: no exit receipt for roles ['api_server'] of the server it ran: "
            "they cannot be verified" in cell.reasons), cell.reasons


def test_a_leg_of_any_item_that_ran_an_api_server_is_served(exit_legs):
    bi0, bi1 = exit_legs
    quality = _copy_leg(bi0, "quality_bi0", item="quality")
    _roles(quality, "api_server", "engine_core", "worker")
    cell = judge_criteria("exit", Q, [bi0, quality, bi1])
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert ("inconclusive: quality bi0 quality_bi0: no exit receipt for roles ['client'] of the server it ran: "
            "they cannot be verified" in cell.reasons), cell.reasons


def test_each_arm_is_verified_on_its_own(exit_legs):
    bi0, bi1 = exit_legs
    edit_meta(bi1, lambda m: m.update(item="forward", processes=[
        {"role": "trainer", "pid": 7, "exit_code": 0, "end_state": "exited"}]))
    cell = judge_criteria("exit", Q, [bi0, bi1])
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert ("inconclusive: bi1: no exit receipt for roles ['client', 'api_server', 'engine_core']: they cannot be "
            "verified" in cell.reasons), cell.reasons


# ---- one worker exit per GPU worker (tensor x pipeline parallel), from the leg's own config


def _workers(leg: Path, n: int, tp: int, pp: int | None) -> None:
    def f(m):
        keep = [p for p in m["processes"] if p["role"] != "worker"]
        worker = next(p for p in m["processes"] if p["role"] == "worker")
        # each worker its own process: its own pid and create time (a copy under a new pid is one worker)
        m["processes"] = keep + [{**worker, "pid": worker["pid"] + 100 * i,
                                  "identity": {**worker["identity"], "create_time": worker["identity"]["create_time"] + i}}
                                 for i in range(n)]
        m["resolved_config"].update(tensor_parallel_size=tp)
        m["resolved_config"].pop("pipeline_parallel_size", None)
        if pp is not None:
            m["resolved_config"]["pipeline_parallel_size"] = pp
    edit_meta(leg, f)


@pytest.mark.parametrize("n,tp,pp,short", [(2, 2, None, False), (1, 2, None, True), (1, 1, 2, True), (2, 1, 2, False),
                                           (3, 2, 2, True), (4, 2, 2, False), (1, 1, None, False)])
def test_a_server_records_one_worker_exit_per_gpu_worker(exit_legs, n, tp, pp, short):
    for leg in exit_legs:
        _workers(leg, n, tp, pp)
    cell = judge_criteria("exit", Q, exit_legs)
    named = [r for r in cell.reasons if "worker exit(s) recorded" in r]
    assert bool(named) == short and (cell.verdict is Verdict.PASS) == (not short), cell.reasons
    if short:
        assert f"{n} worker exit(s) recorded for a server of {tp * (pp or 1)} GPU workers" in named[0]


def test_a_tensor_parallel_one_server_with_no_worker_process_is_not_short_of_workers(exit_legs):
    for leg in exit_legs:
        _roles(leg, "client", "api_server", "engine_core")
    assert judge_criteria("exit", Q, exit_legs).verdict is Verdict.PASS


# ---- "none" and white space: unknown except under the keys whose values are words or text


def test_none_is_unknown_under_every_key_but_the_word_keys_however_deep():
    assert without_placeholders("none", "torch") is None and without_placeholders("none") == "none"
    assert without_placeholders({"versions": ["none", "2.1"]}) == {"versions": [None, "2.1"]}
    assert without_placeholders({"until": {"a": "none", "b": [" "]}}) == {"until": {"a": "none", "b": [" "]}}
    assert without_placeholders({"resps": [{"text": "None", "x": "none"}]}) == {"resps": [{"text": "None", "x": "none"}]}
    assert without_placeholders({"rows": [{"torch": "none", "v": "1"}]}) == {"rows": [{"v": "1"}]}
