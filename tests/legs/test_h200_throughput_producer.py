"""The H200 throughput producer's plan and what its legs record (tica/legs/vllm_kernels/server.py),
checked without a GPU: the crossed order, a continued run's numbering, and that nothing written per
arm other than the switch can differ between the arms' receipts."""

from __future__ import annotations

from tica.legs.throughput import recorded_command
from tica.legs.vllm_kernels.server import _plan


def test_rounds_alternate_which_arm_goes_first():
    plan = _plan(4, (1, 64), 1)
    firsts = [next(x["arm"] for x in plan if x["round"] == r and x["slot"] == 1) for r in range(1, 5)]
    assert firsts == ["bi0", "bi1", "bi0", "bi1"]
    assert {(x["round"], x["arm"], x["c"]) for x in plan} == {(r, a, c) for r in range(1, 5) for a in ("bi0", "bi1")
                                                              for c in (1, 64)}


def test_a_continued_run_keeps_the_order_of_its_round_numbers():
    continued = _plan(3, (1,), 1, first_round=4)
    assert [x["round"] for x in continued if x["slot"] == 1] == [4, 5, 6]
    # round 4 is a BA round whether it runs in the first call or in a continuation
    assert [(x["round"], x["slot"], x["arm"]) for x in continued if x["round"] == 4] == \
        [(r["round"], r["slot"], r["arm"]) for r in _plan(6, (1,), 1) if r["round"] == 4]


def test_the_recorded_server_command_hides_the_port_value_only():
    bi0 = ["python", "-m", "tica.legs.api_server", "--port", "8100", "--seed", "8100"]
    bi1 = ["python", "-m", "tica.legs.api_server", "--port", "8101", "--seed", "8100"]
    assert recorded_command(bi0) == recorded_command(bi1) == \
        ["python", "-m", "tica.legs.api_server", "--port", "{port}", "--seed", "8100"]
    # negative control: another difference between the commands still shows
    assert recorded_command(bi0) != recorded_command([*bi1[:-1], "1"])
