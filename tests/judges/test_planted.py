"""Planted-fault legs are canaries only where they fail beyond their control (tica/judges/planted.py),
checked on the real H200 legs of run3 (mid4 shape, vLLM 0.26, one H200), whose control
(forward_bi1, the same prefill scoring without a fault) fails on its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tica.errors import ReceiptError
from tica.judges.planted import canary_status, canary_table
from tica.question import load_question

ROOT = Path(__file__).resolve().parents[2]
RUN3 = ROOT / "tests" / "fixtures" / "h200" / "run3"
CONTROL = RUN3 / "forward_bi1"
FORWARD = load_question(ROOT / "demo" / "questions" / "h200-mid4" / "forward.yaml")


@pytest.mark.parametrize("leg", ["forward_bi1_planted_fault", "forward_bi1_fault_hf_final_norm"])
def test_a_fault_that_fails_beyond_its_control_is_a_caught_canary(leg):
    status = canary_status(FORWARD, RUN3 / leg, CONTROL)
    assert (status.status, status.shape) == ("caught", "mid4")
    assert "not bitwise equal" in status.reason or "must both be 0" in status.reason


def test_a_fault_that_fails_only_as_its_control_does_is_flagged_not_a_canary():
    """The cuBLAS linear on Hopper: its leg fails, but only on the control's own decode-vs-prefill
    gap; judged alone it would have passed for a caught canary."""
    status = canary_status(FORWARD, RUN3 / "forward_bi1_fault_cublas_linear", CONTROL)
    assert status.status == "not_a_canary" and "mid4" in status.reason
    assert status.target == "model.layers.0.self_attn.o_proj"


def test_a_leg_without_a_planted_fault_is_not_taken_for_a_canary_nor_a_fault_for_a_control():
    with pytest.raises(ReceiptError, match="planted_fault"):
        canary_status(FORWARD, CONTROL, CONTROL)
    with pytest.raises(ReceiptError, match="control must run without"):
        canary_status(FORWARD, RUN3 / "forward_bi1_planted_fault", RUN3 / "forward_bi1_fault_hf_final_norm")


def test_the_table_keeps_one_row_per_pair_in_order():
    pairs = [(RUN3 / n, CONTROL) for n in ("forward_bi1_fault_cublas_linear", "forward_bi1_planted_fault")]
    assert [s.status for s in canary_table(FORWARD, pairs)] == ["not_a_canary", "caught"]
