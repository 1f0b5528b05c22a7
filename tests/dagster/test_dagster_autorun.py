"""A track that asks for re-runs (TICA_AUTORUN_TRACKS) gets them from declarative automation:
after a workload change, exactly the evidence the workload voids is requested."""

from __future__ import annotations

import dataclasses

from dagster import evaluate_automation_conditions
from dagster_project import TRACK
from dagster_helpers import build_defs, kept_instance, materialize_track, tick

from tica.evidence import Component, invalidated_by
from tica_assets.keys import evidence_key


def test_autorun_track_requests_exactly_the_voided_evidence(project, tmp_path):
    settings = dataclasses.replace(project.settings, autorun=frozenset({TRACK}))
    defs = build_defs(settings)
    assert defs.resolve_sensor_def("tica_autorun") is not None
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)
    assert materialize_track(defs, instance, TRACK).success
    first = evaluate_automation_conditions(defs=defs, instance=instance)
    assert first.total_requested == 0

    project.edit("workload", num_prompts=8)
    tick(defs, instance)
    result = evaluate_automation_conditions(defs=defs, instance=instance, cursor=first.cursor)
    requested = {r.key for r in result.results if r.true_subset.size > 0}
    assert requested == {evidence_key(TRACK, i) for i in invalidated_by(Component.WORKLOAD)}


def test_tracks_not_asking_for_reruns_have_no_automation(project):
    defs = build_defs(project.settings)
    assert "tica_autorun" not in {s.name for s in defs.sensors}
    graph = defs.resolve_asset_graph()
    assert all(graph.get(evidence_key(TRACK, i)).automation_condition is None for i in invalidated_by(Component.WEIGHTS))
