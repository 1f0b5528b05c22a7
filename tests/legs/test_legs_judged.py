"""The real CPU legs judged by the same judges as every other track: each leg.json is a valid
receipt, and each cell reflects what vLLM and the trainer actually did on this machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tica.judges import judge_criteria
from tica.question import parse_question
from tica.receipts import LegMeta
from tica.verdict import Verdict

pytestmark = pytest.mark.slow

COMMON = {"compared": "x", "computation": "x", "pass_line": "x", "noise_floor": 0.0,
          "invalid_leg_rule": "a broken seal or workload mismatch is inconclusive and rerun"}


def q(item: str, repeats: int = 1, order=("AB",), **criteria):
    return parse_question({"name": f"cpu-{item}", "item": item, "repeats": repeats, "pairing_order": list(order),
                           **COMMON, "criteria": {"item": item, **criteria}})


def test_every_leg_json_is_a_valid_receipt(demo_legs):
    dirs = [d for v in demo_legs["legs"].values() for d in v]
    assert dirs
    for d in dirs:
        LegMeta.model_validate(json.loads((Path(d) / "leg.json").read_text()))


def test_forward_bi1_is_not_run_with_vllms_reason_and_bi0_differs(demo_legs):
    legs = [d for d in demo_legs["legs"]["forward"] if "vllm_engine" not in str(d)]
    cell = judge_criteria("forward", q("forward", min_steps=5, bi0_reference_mean=None), legs)
    assert any("did not run" in r and "VLLM_BATCH_INVARIANT" in r for r in cell.reasons), cell.reasons
    bi0 = [s for leg in cell.numbers["legs"] if leg["arm"] == "bi0" for s in leg["steps"]]
    assert len(bi0) >= 5 and all(s["mean"] > 0 for s in bi0)
    assert cell.verdict is Verdict.NOT_RUN


def test_throughput_is_not_run_without_bi1_and_bi0_covers_every_concurrency_crossed(demo_legs):
    legs = demo_legs["legs"]["throughput"]
    question = q("throughput", repeats=2, order=("AB", "BA"), input_len=64, output_len=16,
                 concurrencies=[1, 2], num_prompts={1: 6, 2: 6}, warmups=1,
                 formula="median_per_round_paired_loss", budget={1: 0.5, 2: 0.5})
    cell = judge_criteria("throughput", question, legs)
    assert cell.verdict is Verdict.NOT_RUN and "no bi1 leg ran" in cell.summary
    assert any("did not run" in r and "VLLM_BATCH_INVARIANT" in r for r in cell.reasons)
    bi0 = [json.loads((Path(d) / "leg.json").read_text()) for d in legs]
    bi0 = [m for m in bi0 if m["arm"] == "bi0"]
    assert sorted({m["concurrency"] for m in bi0}) == [1, 2]
    assert {(m["round"], m["slot"]) for m in bi0} == {(1, 2), (2, 1)}  # AB then BA: BI=0 second, then first
    for d in legs:
        if json.loads((Path(d) / "leg.json").read_text())["arm"] == "bi0":
            bench = json.loads((Path(d) / "bench.json").read_text())
            assert bench["completed"] == 6 and bench["failed"] == 0 and bench["total_output_tokens"] == 6 * 16


def test_clean_exit_passes_over_every_demo_leg_that_ran_processes(demo_legs):
    """Under the recipe's positive shutdown timeout every client, API server, EngineCore and worker
    of every leg exits on its own. Backward legs are left out: their trainer runs inside the
    producer, so they record no process (and such a leg keeps a cell inconclusive). The timeout-0
    canary is tests/legs/test_clean_exit_cpu.py."""
    legs = [d for item, v in demo_legs["legs"].items() if item != "backward" for d in v]
    cell = judge_criteria("clean_exit", q("clean_exit", required_roles=["client", "api_server", "engine_core", "worker"]),
                          legs)
    assert cell.verdict is Verdict.PASS, cell.reasons
