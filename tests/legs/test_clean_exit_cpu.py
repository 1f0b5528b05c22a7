"""Clean exit on the CPU track, with the real tiny model and vLLM's CPU build: with the recipe's
positive shutdown timeout every process of a serving leg exits on its own and the clean-exit cell
passes; with vLLM's default, 0, vLLM force-kills its EngineCore and the cell fails (the canary)."""

from __future__ import annotations

import pytest

from tests.legs.conftest import leg_json
from tica.judges import judge_criteria
from tica.process_exits import ZERO_TIMEOUT_HINT
from tica.question import parse_question
from tica.verdict import Verdict

pytestmark = pytest.mark.slow

ROLES = {"client", "api_server", "engine_core", "worker"}
QUESTION = parse_question({
    "name": "cpu-clean-exit", "item": "clean_exit", "compared": "x", "computation": "x", "pass_line": "x",
    "noise_floor": 0.0, "repeats": 1, "pairing_order": ["AB"], "invalid_leg_rule": "none",
    "criteria": {"item": "clean_exit", "required_roles": ["client", "api_server", "engine_core", "worker"]}})


@pytest.fixture(scope="module")
def exit_legs(tiny_model, tmp_path_factory):
    """One BI=0 clean-exit leg per shutdown timeout: the recipe's (positive) and vLLM's default, 0."""
    from tica.legs.common import SHUTDOWN_TIMEOUT_S
    from tica.legs.runner import run_leg

    root = tmp_path_factory.mktemp("clean-exit")
    return {t: run_leg("clean_exit", "bi0", root / f"timeout-{t}", model=str(tiny_model), shutdown_timeout=t)
            for t in (SHUTDOWN_TIMEOUT_S, 0)}


def _show(leg) -> dict:
    meta = leg_json(leg)
    for p in meta["processes"]:
        print(f"[clean-exit] shutdown_timeout={meta['resolved_config']['shutdown_timeout']}: {p['role']} pid {p['pid']} "
              f"-> {p['end_state']} (exit {p['exit_code']}): {p['evidence']}")
    return meta


def test_each_leg_records_the_shutdown_timeout_its_server_was_given_and_vllm_applied(exit_legs):
    for timeout, leg in exit_legs.items():
        meta = leg_json(leg)
        assert meta["resolved_config"]["shutdown_timeout"] == timeout
        assert meta["kernels"]["rollout"]["shutdown_timeout"] == timeout  # vLLM's own log line at shutdown
        # the workers' grace after the EngineCore's shutdown follows it (vLLM's 5 s is too little on a loaded host)
        assert meta["env"].get("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS") == (str(timeout) if timeout else None)


def test_with_a_positive_shutdown_timeout_every_process_exits_on_its_own_and_the_cell_passes(exit_legs):
    from tica.legs.common import SHUTDOWN_TIMEOUT_S

    leg = exit_legs[SHUTDOWN_TIMEOUT_S]
    meta = _show(leg)
    assert {p["role"] for p in meta["processes"]} == ROLES
    assert all(p["end_state"] == "exited" and p["exit_code"] == 0 for p in meta["processes"])
    # each exit names its own process by content, read from it while it ran: no two alike
    idents = [p["identity"] for p in meta["processes"]]
    assert all(i.get("create_time") and (i.get("name") or i.get("cmdline")) for i in idents), idents
    assert len({(i["create_time"], i.get("name"), tuple(i.get("cmdline") or ())) for i in idents}) == len(idents)
    assert "producer_cleanup" not in meta["resolved_config"]  # nothing was left for the producer to kill
    cell = judge_criteria("clean_exit", QUESTION, [leg])
    assert cell.verdict is Verdict.PASS, cell.reasons


def test_with_shutdown_timeout_0_vllm_force_kills_the_engine_core_and_the_cell_fails(exit_legs):
    """The canary: vLLM's default fails the cell, and the reason names the timeout."""
    meta = _show(exit_legs[0])
    (core,) = [p for p in meta["processes"] if p["role"] == "engine_core"]
    assert core["end_state"] == "force_killed"
    cell = judge_criteria("clean_exit", QUESTION, [exit_legs[0]])
    assert cell.verdict is Verdict.FAIL
    assert any(ZERO_TIMEOUT_HINT in r for r in cell.reasons), cell.reasons
