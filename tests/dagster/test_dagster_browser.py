"""What a user sees in the real `dagster dev` UI, in headless chromium: the evidence nodes of
the asset graph, the unsynced marker on exactly the evidence a manifest change voids (set by
the daemon's own tick of the manifest sensor), and the acceptance report's cells showing that
evidence as stale. Screenshots are kept under .tica/artifacts/browser/."""

from __future__ import annotations

import os
import re
import shutil

import pytest
from dagster_browser import (CHROMIUM, TICKS, chromium, dagster_dev, drawn_check, graph_nodes, graphql, marked_graph,
                             node_colours, stale_nodes, visible_text, wait_for)
from dagster_project import TRACK, fresh_defs
from dagster_helpers import kept_instance, materialize_track, tick

from tica.evidence import Component, EvidenceItem, invalidated_by
from tica_assets.settings import PROJECT_ROOT

pytestmark = [pytest.mark.browser, pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")]
ARTIFACTS = PROJECT_ROOT / ".tica" / "artifacts" / "browser"
TIMESTAMP = re.compile(r"^[A-Z][a-z]{2} \d{1,2}, \d{1,2}:\d{2} [AP]M$")
STALE = """query { assetNodes(assetKeys: [{path: ["demo", "evidence", "quality"]}]) { staleStatus } }"""


def metadata_value(text: str, key: str) -> str:
    """The value a metadata table row shows: the line after the key and its timestamp."""
    lines = text.splitlines()
    i = lines.index(key) + 1
    while TIMESTAMP.match(lines[i]):
        i += 1
    return lines[i]


def test_graph_unsynced_marker_and_report_cells_in_the_browser(project, tmp_path):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    home = tmp_path / "dagster_home"
    defs = fresh_defs(project)
    instance = kept_instance(home)
    tick(defs, instance)
    assert materialize_track(defs, instance, TRACK).success

    env = {**os.environ, **project.env(), "DAGSTER_HOME": str(home)}
    with dagster_dev(env, tmp_path / "dagster-dev.log") as base:
        graph_url = f"{base}/asset-groups/{TRACK}"
        # Dagster draws only the nodes in view: a window tall enough for the whole graph.
        nodes = graph_nodes(chromium(graph_url, size="1600,1800"))
        evidence = {item.value for item in EvidenceItem}
        assert evidence | {"report"} <= set(nodes), nodes
        assert not any(nodes.values()), f"unsynced before any change: {nodes}"

        # A new scorer: the daemon's sensor tick observes it and records the invalidations.
        original = project.manifest()["eval_contract"]["scorer"]
        project.edit("eval_contract", scorer="tica.scorer.boxed/2")
        wait_for(lambda: graphql(base, STALE)["data"]["assetNodes"][0]["staleStatus"] == "STALE",
                 120, "the manifest sensor's tick in the daemon")
        # The canvas asks for stale status on its own after it draws (a second query): under load the
        # first DOM may be taken before the answer, so read it again until a marker is drawn.
        nodes = wait_for(lambda: marked_graph(graph_url), 120, "an unsynced marker on the canvas")
        chromium(graph_url, screenshot=ARTIFACTS / "asset-graph-after-scorer-change.png", size="1600,1800")
        voided = {i.value for i in invalidated_by(Component.EVAL_CONTRACT)}
        assert {label for label, stale in nodes.items() if stale} == voided, nodes

        quality = visible_text(chromium(f"{base}/assets/{TRACK}/evidence/quality"))
        forward = visible_text(chromium(f"{base}/assets/{TRACK}/evidence/forward"))
        assert "Unsynced" in quality and "Unsynced" not in forward
        assert "receipt_hashes" in quality and "question_hash" in quality and "verdict" in quality

        # The report re-read from the ledger shows the voided cells as stale, never as a pass.
        assert materialize_track(defs, instance, TRACK, job="report").success
        report_url = f"{base}/assets/{TRACK}/report"
        text = visible_text(chromium(report_url))
        chromium(report_url, screenshot=ARTIFACTS / "report-after-scorer-change.png")
        for item in evidence:
            shown = metadata_value(text, f"cell: {item}")
            assert shown.startswith("stale (was pass)") == (item in voided), (item, shown)
            if item not in voided:
                assert shown == "pass"
        assert metadata_value(text, "acceptance").startswith("not accepted")
        # the report's first line answers. The canvas draws a node red when one of its checks failed
        # with severity ERROR (Dagster UI's AssetNodeStatusContent, CHECKS_FAILED): the report is
        # red while not accepted, every passing evidence node green
        assert metadata_value(text, "answer").startswith(f"{TRACK}: not accepted — {7 - len(voided)} of 7 pass; "
                                                         f"{len(voided)} stale")
        assert drawn_check(base, [TRACK, "report"], "accepted") == ("FAILED", "ERROR")
        colours = node_colours(chromium(graph_url, size="1600,1800"))
        chromium(graph_url, screenshot=ARTIFACTS / "asset-graph-not-accepted.png", size="1600,1800")
        assert "red" in colours["report"].lower() and "green" in colours["forward"].lower(), colours
        for item in evidence:
            assert drawn_check(base, [TRACK, "evidence", item], "verdict") == ("SUCCEEDED", "ERROR"), item
        # the sensor's tick says what it voided
        ticks = graphql(base, TICKS)["data"]["sensorOrError"]["sensorState"]["ticks"]
        reasons = [t["skipReason"] or "" for t in ticks]
        assert any(r.startswith(f"{TRACK}: eval_contract changed, voiding ") for r in reasons), reasons
        assert not any("empty result" in r for r in reasons), reasons

        # Reverted: the next tick records the change back; graph and report agree again.
        project.edit("eval_contract", scorer=original)
        wait_for(lambda: not stale_nodes(base), 120, "the manifest sensor's tick after the revert")
        assert materialize_track(defs, instance, TRACK, job="report").success
        text = visible_text(chromium(report_url))
        chromium(report_url, screenshot=ARTIFACTS / "report-after-revert.png")
        assert metadata_value(text, "answer") == f"{TRACK}: accepted — 7 of 7 pass"
        assert all(metadata_value(text, f"cell: {item}") == "pass" for item in evidence)
        assert drawn_check(base, [TRACK, "report"], "accepted") == ("SUCCEEDED", "ERROR")
        chromium(graph_url, screenshot=ARTIFACTS / "asset-graph-after-revert.png", size="1600,1800")
        colours = node_colours(chromium(graph_url, size="1600,1800"))
        assert "green" in colours["report"].lower(), colours
    shutil.copy(tmp_path / "dagster-dev.log", ARTIFACTS / "dagster-dev.log")
