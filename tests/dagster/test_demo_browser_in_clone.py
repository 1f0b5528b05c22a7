"""The demo as shipped, in a git clone of this repository, where a user looks (headless chromium
on the real `dagster dev`): the demo prints the track's one-line answer; the canvas draws every
evidence node by its verdict (green only for a pass) and the report node red while the
candidate is not accepted; the report page the demo wrote opens with the same first line;
editing the scorer in the clone's demo manifest voids exactly the scorer's items (the daemon's
sensor tick says what and why) and reverting makes graph and report agree again.

The replayed H200 SmolLM2 track keeps this short: its legs are committed receipts, so nothing
runs but Dagster, the judges and the UI. The CPU track's own legs: tests/legs/test_demo_cpu_track.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from dagster_browser import (CHROMIUM, TICKS, chromium, dagster_dev, drawn_check, graph_nodes, graphql, node_colours,
                             stale_nodes, visible_text, wait_for)

from tica.evidence import Component, EvidenceItem, invalidated_by
from tica.ledger import Ledger
from tica_assets.demo import DEFAULT_ENV
from tica_assets.keys import safe_name
from tica_assets.settings import PROJECT_ROOT

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")]
TRACK = "h200-smollm2"
MANIFEST = f"demo/candidates/{TRACK}.yaml"
ARTIFACTS = PROJECT_ROOT / ".tica" / "artifacts" / "browser"
EVIDENCE = {item.value for item in EvidenceItem}


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    if subprocess.run(["git", "-C", str(PROJECT_ROOT), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("the project is not a git checkout")
    root = tmp_path_factory.mktemp("clone") / "tica"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(PROJECT_ROOT), str(root)], check=True)
    return root


def demo_env(root) -> dict[str, str]:
    """What scripts/demo.sh exports, in the clone; nothing of this checkout's own settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TICA_", "DAGSTER_"))}
    env.update({k: v if k == "TICA_REPLAY" else str(root / v) for k, v in DEFAULT_ENV.items()})
    return {**env, "PYTHONPATH": str(root), "TICA_SENSOR_INTERVAL_S": "5"}


def report_headline(root, env) -> str:
    """The first line of `tica report` in the clone: the candidate its manifest names now."""
    out = subprocess.run([sys.executable, "-m", "tica.cli", "--ledger", env["TICA_LEDGER"], "report", TRACK,
                          "--manifest", MANIFEST, "--questions", "demo/questions"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=300)
    first = out.stdout.splitlines()[0] if out.stdout else ""
    # exit 0 only for an accepted track, 1 for one that is not
    assert out.returncode == (0 if f"{TRACK}: accepted" in first else 1), out.stdout[-2000:] + out.stderr[-3000:]
    return first


def edit(path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def test_the_demo_in_a_clone_answers_on_the_canvas_and_staleness_is_exact(clone, tmp_path):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    env = demo_env(clone)
    demo = subprocess.run([sys.executable, "-m", "tica_assets.demo", "--tracks", TRACK, "--models", ""],
                          cwd=clone, env=env, capture_output=True, text=True, timeout=900)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-5000:]
    (answer,) = [line for line in demo.stdout.splitlines() if line.startswith(f"{TRACK}: ")]
    assert answer.startswith(f"{TRACK}: not accepted — "), answer
    assert report_headline(clone, env) == answer  # the command line gives the same answer
    rows = {r["item"]: r for r in Ledger(env["TICA_LEDGER"]).rows(
        "SELECT item, verdict, after_the_fact FROM track_verdicts WHERE track = ?", [TRACK])}
    assert set(rows) == EVIDENCE, rows
    # green only for a pass judged under a question frozen before its legs ran (Dagster draws a
    # node red when one of its ERROR checks failed: the verdict, or frozen_before_run)
    green = {item for item, r in rows.items() if r["verdict"] == "pass" and not r["after_the_fact"]}
    assert answer.startswith(f"{TRACK}: not accepted — {len(green)} of 7 pass; "), answer

    page = visible_text(chromium((clone / "data" / "report.html").as_uri()))
    assert answer in page, page[:2000]

    group = safe_name(TRACK)
    with dagster_dev(env, tmp_path / "dagster-dev.log", root=clone) as base:
        graph_url = f"{base}/locations/tica/asset-groups/{group}"  # the group alone, expanded
        colours = node_colours(chromium(graph_url, size="1600,1800"))
        chromium(graph_url, screenshot=ARTIFACTS / "demo-clone-asset-graph.png", size="1600,1800")
        for item in EVIDENCE:
            assert ("green" if item in green else "red") in colours[item].lower(), (item, rows[item], colours)
            assert drawn_check(base, [TRACK, "evidence", item], "verdict") == (
                "SUCCEEDED" if rows[item]["verdict"] == "pass" else "FAILED", "ERROR"), item
        assert "red" in colours["report"].lower(), colours
        assert drawn_check(base, [TRACK, "report"], "accepted") == ("FAILED", "ERROR")
        assert not stale_nodes(base, group)

        # the scorer changes in the clone's manifest: the daemon's tick voids exactly its items
        manifest = clone / MANIFEST
        original = manifest.read_text()
        edit(manifest, 'scorer: "', 'scorer: "edited-')
        voided = {i.value for i in invalidated_by(Component.EVAL_CONTRACT)}
        wait_for(lambda: stale_nodes(base, group) & EVIDENCE == voided, 180, "the manifest sensor's tick in the daemon")
        chromium(graph_url, screenshot=ARTIFACTS / "demo-clone-asset-graph-after-scorer-change.png", size="1600,1800")
        nodes = graph_nodes(chromium(graph_url, size="1600,1800"))
        assert {label for label, stale in nodes.items() if stale and label in EVIDENCE} == voided, nodes
        ticks = graphql(base, TICKS)["data"]["sensorOrError"]["sensorState"]["ticks"]
        reasons = [t["skipReason"] or "" for t in ticks]
        assert any(r.startswith(f"{TRACK}: eval_contract changed, voiding ") for r in reasons), reasons
        stale_answer = report_headline(clone, env)
        assert stale_answer.startswith(f"{TRACK}: not accepted — {len(green - voided)} of 7 pass; "), stale_answer
        assert f"{len(voided)} stale (" in stale_answer, stale_answer

        # reverted: the next tick brings the candidate back; graph and report agree again
        manifest.write_text(original)
        wait_for(lambda: not stale_nodes(base, group), 180, "the manifest sensor's tick after the revert")
        assert report_headline(clone, env) == answer
        chromium(graph_url, screenshot=ARTIFACTS / "demo-clone-asset-graph-after-revert.png", size="1600,1800")
    shutil.copy(tmp_path / "dagster-dev.log", ARTIFACTS / "demo-clone-dagster-dev.log")
