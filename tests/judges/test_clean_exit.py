"""Clean exit: client and server verified separately; every worker, EngineCore and API server
must end normally; vLLM's force kill of EngineCore is not clean."""

from __future__ import annotations

import pytest

from tica.canaries import process_exit, edit_meta
from tica.judges import judge_criteria
from tica.process_exits import ZERO_TIMEOUT_HINT, exit_problem
from tica.receipts import ProcessExit
from tica.verdict import Verdict

from .conftest import leg, question

Q = question("clean_exit")


def test_every_process_exited_zero_passes_client_and_server_apart(receipts):
    cell = judge_criteria("exit", Q, receipts("clean_exit"))
    assert cell.verdict is Verdict.PASS, cell.reasons
    assert cell.numbers["client"]["verdict"] == "pass" and cell.numbers["server"]["verdict"] == "pass"
    assert cell.numbers["client"]["processes"] == 2 and cell.numbers["server"]["processes"] == 6


def test_force_killed_engine_core_fails_the_server_side_only(receipts):
    legs = receipts("clean_exit")
    process_exit("engine_core", evidence="(EngineCore_DP0 pid=2170) Force killing remaining process EngineCore")(Q, legs)
    cell = judge_criteria("exit", Q, legs)
    assert cell.verdict is Verdict.FAIL and cell.reasons[0].startswith("fail: server:")
    assert cell.numbers["client"]["verdict"] == "pass"


@pytest.mark.parametrize("role,kv", [
    ("client", {"exit_code": 1}),
    ("api_server", {"end_state": "killed", "exit_code": None, "signal": "SIGTERM"}),
    ("worker", {"end_state": "signalled", "exit_code": -9, "signal": 9}),
    ("engine_core", {"end_state": "running", "exit_code": None}),
])
def test_any_role_not_ending_normally_fails(receipts, role, kv):
    legs = receipts("clean_exit")
    process_exit(role, **kv)(Q, legs)
    cell = judge_criteria("exit", Q, legs)
    assert cell.verdict is Verdict.FAIL and role in cell.reasons[0]


def test_a_client_failure_is_reported_on_the_client_side(receipts):
    legs = receipts("clean_exit")
    process_exit("client", exit_code=2)(Q, legs)
    cell = judge_criteria("exit", Q, legs)
    assert cell.reasons[0].startswith("fail: client:") and cell.numbers["server"]["verdict"] == "pass"


def test_a_leg_without_exit_receipts_is_inconclusive(receipts):
    legs = receipts("clean_exit")
    edit_meta(leg(legs, "bi0"), lambda m: m.update(processes=[]))
    assert judge_criteria("exit", Q, legs).verdict is Verdict.INCONCLUSIVE


def test_a_required_role_never_seen_is_inconclusive(receipts):
    legs = receipts("clean_exit")
    for p in legs:
        edit_meta(p, lambda m: m.update(processes=[x for x in m["processes"] if x["role"] != "api_server"]))
    cell = judge_criteria("exit", Q, legs)
    assert cell.verdict is Verdict.INCONCLUSIVE and "api_server" in cell.reasons[0]


def test_throughput_legs_exits_are_read_too(receipts):
    legs = receipts("throughput")
    assert judge_criteria("exit", Q, legs).verdict is Verdict.PASS
    process_exit("worker", end_state="force_killed", exit_code=None)(Q, legs)
    assert judge_criteria("exit", Q, legs).verdict is Verdict.FAIL


def test_exit_problem_reads_the_evidence_not_only_the_code():
    ok = ProcessExit(role="engine_core", pid=1, exit_code=0, end_state="exited")
    forced = ok.model_copy(update={"evidence": "INFO shutdown: force killing remaining process EngineCore"})
    assert exit_problem(ok) is None and "force killed" in exit_problem(forced)


FORCED = {"end_state": "force_killed", "exit_code": -9, "signal": 9,
          "evidence": "[shutdown] Process manager: force killing remaining process EngineCore pid 9012"}


def _force_kill_engine_core_under(legs, shutdown_timeout):
    """legs[0]'s EngineCore force-killed by vLLM, with the leg's recorded shutdown timeout (None: unrecorded)."""
    def record(m):
        if shutdown_timeout is not None:
            m["resolved_config"]["shutdown_timeout"] = shutdown_timeout
    edit_meta(legs[0], record)
    process_exit("engine_core", **FORCED)(Q, legs)


def test_a_force_kill_under_shutdown_timeout_0_fails_and_names_the_timeout(receipts):
    legs = receipts("clean_exit")
    _force_kill_engine_core_under(legs, 0)
    cell = judge_criteria("exit", Q, legs)
    assert cell.verdict is Verdict.FAIL
    assert any(ZERO_TIMEOUT_HINT in r for r in cell.reasons), cell.reasons


@pytest.mark.parametrize("shutdown_timeout", [30, None])
def test_a_force_kill_under_a_positive_or_unrecorded_timeout_fails_without_the_zero_timeout_hint(receipts, shutdown_timeout):
    """The negative control: the hint is read from the recorded timeout, never assumed; the force
    kill fails the cell either way."""
    legs = receipts("clean_exit")
    _force_kill_engine_core_under(legs, shutdown_timeout)
    cell = judge_criteria("exit", Q, legs)
    assert cell.verdict is Verdict.FAIL
    assert not any(ZERO_TIMEOUT_HINT in r for r in cell.reasons), cell.reasons


def test_vllms_logged_shutdown_timeout_is_the_one_read():
    """What vLLM logged applying (kernels.rollout) before what the producer passed (resolved_config)."""
    from tica.process_exits import recorded_shutdown_timeout
    from tica.receipts import LegMeta

    base = {"schema": "tica.leg/1", "item": "clean_exit", "arm": "bi0", "producer": "t", "producer_version": "1"}
    assert recorded_shutdown_timeout(LegMeta.model_validate(base)) is None
    assert recorded_shutdown_timeout(LegMeta.model_validate({**base, "resolved_config": {"shutdown_timeout": 30}})) == 30
    both = {**base, "resolved_config": {"shutdown_timeout": 30}, "kernels": {"rollout": {"shutdown_timeout": 0}}}
    assert recorded_shutdown_timeout(LegMeta.model_validate(both)) == 0
