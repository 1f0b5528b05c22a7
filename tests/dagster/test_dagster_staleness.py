"""A change of candidate unsyncs exactly the evidence it touches, with the cause Dagster names.

The whole graph of one track is materialized in-process (receipts written when asked, judged by
the real core); then one component changes in the manifest, one sensor tick is evaluated and its
events applied, and Dagster's GraphQL (`staleStatus`, `staleCauses`) is asked what is unsynced.
"""

from __future__ import annotations

from dagster_project import TRACK, fresh_defs
from dagster_helpers import build_defs, graphql_context, kept_instance, materialize_track, stale_nodes, tick

from tica.evidence import Component, EvidenceItem, invalidated_by
from tica.ledger import Ledger
from tica_assets.evidence import COVERS
from tica_assets.keys import component_key, evidence_key, report_key

EVIDENCE = [evidence_key(TRACK, item).path for item in EvidenceItem]
CHANGES = {
    Component.WEIGHTS: lambda p: p.new_weights("v2"),
    Component.EVAL_CONTRACT: lambda p: p.edit("eval_contract", scorer="tica.scorer.boxed/2"),
    Component.WORKLOAD: lambda p: p.edit("workload", num_prompts=8),
}


def stale_items(nodes) -> set[EvidenceItem]:
    return {EvidenceItem(k[-1]) for k, n in nodes.items() if k[1] == "evidence" and n["staleStatus"] == "STALE"}


def report_cells(instance) -> dict[str, str]:
    event = instance.get_latest_materialization_event(report_key(TRACK))
    meta = event.asset_materialization.metadata
    return {k.removeprefix("cell: "): v.value for k, v in meta.items() if k.startswith("cell: ")}


def legs_judged(instance, item: EvidenceItem) -> int:
    event = instance.get_latest_materialization_event(evidence_key(TRACK, item))
    return event.asset_materialization.metadata["legs_judged"].value


def test_each_change_unsyncs_exactly_the_sensitive_evidence_with_its_cause(project, tmp_path):
    defs = fresh_defs(project)
    instance = kept_instance(tmp_path / "dagster_home")
    first = tick(defs, instance)
    assert len(first.asset_events) == len(Component), "first sight observes every component"
    assert materialize_track(defs, instance, TRACK).success
    ledger = Ledger(project.settings.ledger_path)
    covered = legs_judged(instance, EvidenceItem.ARTIFACTS)

    with graphql_context(instance, project.env()) as gql:
        nodes = stale_nodes(gql, [*EVIDENCE, report_key(TRACK).path])
        assert {n["staleStatus"] for n in nodes.values()} == {"FRESH"}

        for component, change in CHANGES.items():
            change(project)
            data = tick(defs, instance)
            observed = {e.asset_key for e in data.asset_events}
            assert observed == {component_key(TRACK, component)}, f"{component}: observed {observed}"

            nodes = stale_nodes(gql, [*EVIDENCE, report_key(TRACK).path])
            expected = set(invalidated_by(component))
            assert stale_items(nodes) == expected, component
            for item in expected:
                causes = nodes[tuple(evidence_key(TRACK, item).path)]["staleCauses"]
                data_causes = [c for c in causes if c["category"] == "DATA"]
                assert [c["key"]["path"] for c in data_causes] == [component_key(TRACK, component).path], causes
                assert "new data version" in data_causes[0]["reason"]
            # Staleness is not transitive: the report is not unsynced by Dagster, but when it is
            # re-read from the ledger it shows exactly those cells as stale, never as a pass.
            assert nodes[tuple(report_key(TRACK).path)]["staleStatus"] == "FRESH"

            rows = ledger.rows("SELECT item, cause FROM invalidations WHERE component = ? ORDER BY seq",
                               [component.value])
            assert {r["item"] for r in rows} == {i.value for i in expected}
            assert all(r["cause"].startswith(component.value) for r in rows)

            assert materialize_track(defs, instance, TRACK, job="report").success
            cells = report_cells(instance)
            assert {k for k, v in cells.items() if v.startswith("stale (was pass)")} == {i.value for i in expected}
            assert all(v == "pass" for k, v in cells.items() if k not in {i.value for i in expected})

            # Re-running an item runs new legs, whose exits and receipts clean exit and the final
            # artifacts must cover again: Dagster unsyncs them through their evidence deps.
            covering = {i for i, covered in COVERS.items() if expected & set(covered)}
            rerun = [evidence_key(TRACK, i) for i in EvidenceItem if i in expected | covering] + [report_key(TRACK)]
            assert materialize_track(defs, instance, TRACK, keys=rerun).success
            nodes = stale_nodes(gql, [*EVIDENCE, report_key(TRACK).path])
            assert {n["staleStatus"] for n in nodes.values()} == {"FRESH"}, component
            assert set(report_cells(instance).values()) == {"pass"}
            # Evidence a change did not void still counts: the artifacts cover every leg again.
            assert legs_judged(instance, EvidenceItem.ARTIFACTS) == covered, component

    # Reruns are appended, each linked to the verdict it reruns when the candidate is the same.
    history = ledger.rows("SELECT candidate_id, verdict_id, rerun_of FROM verdicts WHERE item = 'artifacts' ORDER BY seq")
    assert len(history) == 1 + len(CHANGES)
    assert ledger.verify().ok


def test_evidence_refuses_a_component_version_dagster_has_not_observed(project, tmp_path):
    defs = build_defs(project.settings)
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)
    project.edit("backends", attention="TORCH_SDPA")  # no tick: Dagster has not seen it
    result = defs.resolve_job_def(f"{TRACK}_evidence").execute_in_process(
        instance=instance, raise_on_error=False, asset_selection=[evidence_key(TRACK, EvidenceItem.FORWARD)]
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "backends" in failure.message or "backends" in str(failure.event_specific_data.error)
    assert Ledger(project.settings.ledger_path).rows("SELECT count(*) AS n FROM verdicts")[0]["n"] == 0
