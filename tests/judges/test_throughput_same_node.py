"""Throughput pairing on one node (issue 15): crossed rounds compare the arms on one machine. Every
leg must record its node (RayLegRunner puts it in leg.json's env as TICA_NODE; TICA's producers and
`tica leg run` record this host as resolved_config.node) and all must name the same one; a pairing
spread over two nodes is confounded by the node, and one whose legs record none is not shown to be
free of it: neither passes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.judges.test_throughput_basis import UNDER, basis_question
from tests.stats.pilots import throughput_question, write_pilot
from tica.canaries import edit_json
from tica.judges import judge_criteria
from tica.verdict import Verdict


@pytest.fixture
def legs(tmp_path) -> list[Path]:
    """A passing pairing: five crossed rounds at c=8, every round under the budget."""
    return write_pilot(throughput_question(5), tmp_path / "legs", {8: UNDER})


def _round(leg: Path) -> int:
    return json.loads((leg / "leg.json").read_text())["round"]


def record_node(leg: Path, node: str | None, key: str = "env") -> None:
    """The leg records `node` under `key` alone (None: no node at all)."""
    def put(meta: dict) -> None:
        meta.setdefault("env", {}).pop("TICA_NODE", None)
        meta.setdefault("resolved_config", {}).pop("node", None)
        if node is not None and key == "env":
            meta["env"]["TICA_NODE"] = node
        elif node is not None:
            meta["resolved_config"]["node"] = node
    edit_json(leg / "leg.json", put, reseal=leg)


def test_a_pairing_on_one_recorded_node_passes(legs):
    for leg in legs:
        record_node(leg, "h200a")
    cell = judge_criteria("throughput", basis_question(), legs)
    assert cell.verdict is Verdict.PASS, cell.reasons
    assert cell.numbers["nodes"] == {"h200a": len(legs)}


def test_a_pairing_spread_over_two_nodes_does_not_pass_and_names_them(legs):
    """The negative control of the test above: the same receipts, rounds 4 and 5 on another node."""
    for leg in legs:
        record_node(leg, "h200b" if _round(leg) >= 4 else "h200a")
    cell = judge_criteria("throughput", basis_question(), legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    reason = next(r for r in cell.reasons if "different nodes" in r)
    on_b = sum(_round(leg) >= 4 for leg in legs)
    assert reason.startswith("inconclusive: ") and f"h200a: {len(legs) - on_b} leg(s)" in reason
    assert f"h200b: {on_b} leg(s)" in reason and "confounded by the node" in reason
    assert cell.numbers["nodes"] == {"h200a": len(legs) - on_b, "h200b": on_b}


def test_the_arms_on_different_nodes_do_not_pass(legs):
    """BI=1 on one node, BI=0 on another: the loss would be the nodes' difference."""
    for leg in legs:
        record_node(leg, "h200a" if json.loads((leg / "leg.json").read_text())["arm"] == "bi1" else "h200b")
    assert judge_criteria("throughput", basis_question(), legs).verdict is Verdict.INCONCLUSIVE


def test_a_node_in_resolved_config_counts_too(legs):
    for leg in legs:
        record_node(leg, "h200b" if _round(leg) == 1 else "h200a", key="resolved_config")
    cell = judge_criteria("throughput", basis_question(), legs)
    assert cell.verdict is Verdict.INCONCLUSIVE and any("different nodes" in r for r in cell.reasons)


def test_a_node_recorded_by_some_legs_only_does_not_pass(legs):
    for leg in legs:
        record_node(leg, "h200a" if _round(leg) != 3 else None)
    cell = judge_criteria("throughput", basis_question(), legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any("not known to have run on one node" in r for r in cell.reasons), cell.reasons


def test_legs_that_record_no_node_do_not_pass(legs):
    """The negative control is the first test: the same receipts, each naming one node, pass."""
    for leg in legs:
        record_node(leg, None)
    cell = judge_criteria("throughput", basis_question(), legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert cell.numbers["nodes"] is None
    assert any("no leg records the node it ran on" in r and "not shown to have run on one node" in r
               for r in cell.reasons), cell.reasons


def test_the_ray_node_and_the_host_recorded_together_name_one_node(legs):
    """Under RayLegRunner a leg records both (TICA_NODE and this host): one node, both named."""
    for leg in legs:
        record_node(leg, "h200a")
        edit_json(leg / "leg.json", lambda m: m["resolved_config"].update(node="gpu-host-1 (boot 5e1f)"), reseal=leg)
    cell = judge_criteria("throughput", basis_question(), legs)
    assert cell.verdict is Verdict.PASS, cell.reasons
    assert cell.numbers["nodes"] == {"gpu-host-1 (boot 5e1f) + h200a": len(legs)}


def test_an_overrun_on_two_nodes_still_fails_with_the_nodes_named(tmp_path):
    paths = write_pilot(throughput_question(5), tmp_path / "over", {8: [0.3] * 5})
    for leg in paths:
        record_node(leg, "h200b" if _round(leg) >= 4 else "h200a")
    cell = judge_criteria("throughput", basis_question(), paths)
    assert cell.verdict is Verdict.FAIL
    assert any(r.startswith("note: the pairing's legs ran on different nodes") for r in cell.reasons), cell.reasons
