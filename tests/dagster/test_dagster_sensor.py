"""The manifest sensor: a missing or malformed manifest is a logged skip naming the file and
the field, never an invalidation; tracks live side by side and a change in one touches only it."""

from __future__ import annotations

import copy
import logging

import pytest
import yaml
from dagster_project import MANIFEST, TRACK
from dagster_helpers import build_defs, kept_instance, tick

from sensors.manifests import evaluate_track
from tica.evidence import EvidenceItem, Component, invalidated_by
from tica.ledger import Ledger
from tica_assets.keys import component_key
from tica_assets.tracks import Track

log = logging.getLogger("tica.test.sensor")


def invalidations(project) -> list[dict]:
    return Ledger(project.settings.ledger_path).rows("SELECT track, component, item FROM invalidations ORDER BY seq")


def drop(section: str, field: str):
    def edit(project):
        data = project.manifest()
        del data[section][field]
        project.write_manifest(data)
    return edit


BAD = {
    "malformed YAML": (lambda p: p.manifest_path.write_text("track: demo\nworkload: [unclosed\n"), "<yaml>"),
    "missing field": (drop("workload", "num_prompts"), "workload.num_prompts"),
    "bad recipe": (lambda p: p.edit("recipe", bi1="python -m tica.legs.forward"), "recipe"),
    "renamed track": (lambda p: p.write_manifest({**p.manifest(), "track": "renamed"}), "track"),
    "missing file": (lambda p: p.manifest_path.unlink(), "<file>"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_manifest_is_a_logged_skip_never_an_invalidation(project, tmp_path, caplog, case):
    defs = build_defs(project.settings)
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)
    good = project.manifest()
    spoil, field = BAD[case]
    spoil(project)

    data = tick(defs, instance)
    assert data.asset_events == [] and invalidations(project) == []
    track = Track(name=TRACK, manifest_path=project.manifest_path.resolve())  # as the graph was built
    with caplog.at_level(logging.INFO, logger=log.name):
        events, _ = evaluate_track(track, project.settings, instance, Ledger(project.settings.ledger_path), log)
    assert events == []
    (record,) = [r for r in caplog.records if r.name == log.name]
    assert str(project.manifest_path) in record.getMessage() and f": {field}" in record.getMessage()
    assert "nothing invalidated" in record.getMessage()

    # Fixed (with a real change): the invalidation is against what Dagster last observed.
    good["workload"] = {**good["workload"], "num_prompts": 16}
    project.write_manifest(good)
    data = tick(defs, instance)
    assert {e.asset_key for e in data.asset_events} == {component_key(TRACK, Component.WORKLOAD)}
    assert {r["item"] for r in invalidations(project)} == {i.value for i in invalidated_by(Component.WORKLOAD)}
    # the tick says what it recorded and voided, not Dagster's "empty result"
    voided = ", ".join(i.value for i in EvidenceItem if i in invalidated_by(Component.WORKLOAD))
    assert data.skip_message == f"{TRACK}: workload changed, voiding {voided} (recorded in the ledger)"


def test_tracks_side_by_side_a_change_touches_only_its_track(project, tmp_path):
    other = copy.deepcopy(MANIFEST) | {"track": "other-model"}
    (project.settings.candidates_dir / "other.yaml").write_text(yaml.safe_dump(other))
    defs = build_defs(project.settings)
    keys = {k.to_user_string() for k in defs.resolve_all_asset_keys()}
    assert {"demo/evidence/forward", "other-model/evidence/forward", "other-model/report"} <= keys
    instance = kept_instance(tmp_path / "dagster_home")
    assert len(tick(defs, instance).asset_events) == 2 * len(Component)

    project.edit("eval_contract", scorer="tica.scorer.boxed/2")
    data = tick(defs, instance)
    assert {e.asset_key for e in data.asset_events} == {component_key(TRACK, Component.EVAL_CONTRACT)}
    assert {r["track"] for r in invalidations(project)} == {TRACK}
    assert tick(defs, instance).asset_events == []  # applied: the next tick sees nothing new


def test_observing_from_the_ui_records_the_change_as_the_sensor_would(project, tmp_path):
    from dagster._core.definitions.observe import observe  # what the UI's "Observe" runs

    defs = build_defs(project.settings)
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)
    project.edit("workload", input_len=128)
    source = defs.resolve_assets_def(component_key(TRACK, Component.WORKLOAD))
    assert observe([source], instance=instance).success  # resources come bound from the definitions
    assert {r["item"] for r in invalidations(project)} == {i.value for i in invalidated_by(Component.WORKLOAD)}
    assert tick(defs, instance).asset_events == []  # already observed: nothing recorded twice
    assert len(invalidations(project)) == len(invalidated_by(Component.WORKLOAD))
