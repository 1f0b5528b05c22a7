"""The graph's shape, pinned: which component feeds which evidence (the invalidation matrix
through `sensitive_components`), pools, blocking checks, and `dagster definitions validate`."""

from __future__ import annotations

import os
import subprocess

import pytest

from dagster_browser import DAGSTER
from dagster_project import TRACK
from dagster_helpers import build_defs

from tica import checks as checks_module
from tica.evidence import Component, EvidenceItem, sensitive_components
from tica_assets.evidence import COVERS, VERDICT_CHECKS
from tica_assets.keys import GPU_POOL, LEDGER_POOL, component_key, evidence_key, report_key
from tica_assets.settings import PROJECT_ROOT

# The snapshot: an accidental change of the matrix or of the factory shows up here.
SNAPSHOT = {
    "forward": "backends graph_cache hardware image precision recipe runner source weights",
    "backward": "backends hardware image precision recipe runner source weights",
    "update": "backends graph_cache hardware image precision recipe runner source weights",
    "quality": "backends eval_contract graph_cache hardware image precision recipe runner source weights",
    "throughput": "backends graph_cache hardware image precision recipe runner source weights workload",
    # a backward leg runs the trainer alone: it starts no vLLM process for clean exit to judge;
    # eval_contract and workload: the quality and throughput legs rerun after such a change start
    # new servers, whose exits are checked again
    "clean_exit": "backends eval_contract graph_cache hardware image precision recipe runner source weights workload"
                  " +forward +quality +throughput +update",
    "artifacts": "backends eval_contract graph_cache hardware image precision recipe runner source weights workload"
                 " +backward +clean_exit +forward +quality +throughput +update",
}


def deps_line(graph, item: EvidenceItem) -> str:
    parents = graph.get(evidence_key(TRACK, item)).parent_keys
    comps = sorted(k.path[-1] for k in parents if k.path[1] == "candidate")
    evidence = sorted("+" + k.path[-1] for k in parents if k.path[1] == "evidence")
    return " ".join(comps + evidence)


def test_evidence_depends_exactly_on_its_sensitive_components(project):
    graph = build_defs(project.settings).resolve_asset_graph()
    for item in EvidenceItem:
        parents = graph.get(evidence_key(TRACK, item)).parent_keys
        assert {k for k in parents if k.path[1] == "candidate"} == {component_key(TRACK, c) for c in sensitive_components(item)}
        assert {k for k in parents if k.path[1] == "evidence"} == {evidence_key(TRACK, i) for i in COVERS.get(item, ())}
        assert deps_line(graph, item) == SNAPSHOT[item.value], item
    assert graph.get(report_key(TRACK)).parent_keys == {evidence_key(TRACK, i) for i in EvidenceItem}
    for c in Component:
        assert graph.get(component_key(TRACK, c)).is_observable


def test_pools_and_blocking_checks(project):
    defs = build_defs(project.settings)
    graph = defs.resolve_asset_graph()
    for item in EvidenceItem:
        node = graph.get(evidence_key(TRACK, item))
        assert node.pools == {LEDGER_POOL if item in COVERS else GPU_POOL}
        checks = {k.name: graph.get_check_spec(k).blocking for k in node.check_keys}
        assert checks.get("canaries_caught") is True
        if item is not EvidenceItem.ARTIFACTS:
            assert checks.get("receipts_sealed") is True
    quality = {k.name for k in graph.get(evidence_key(TRACK, EvidenceItem.QUALITY)).check_keys}
    assert "quality_sums" in quality
    throughput = {k.name: graph.get_check_spec(k).blocking for k in graph.get(evidence_key(TRACK, EvidenceItem.THROUGHPUT)).check_keys}
    # required for acceptance (tica.checks.REQUIRED), drawn as a failure, and not holding back what runs after it
    assert throughput["workload_receipts"] is False
    for item in EvidenceItem:  # every check an item's verdict needs before it is accepted is declared
        declared = {k.name: graph.get_check_spec(k).blocking for k in graph.get(evidence_key(TRACK, item)).check_keys}
        assert declared == {"verdict": False, **{name: name not in VERDICT_CHECKS for name in checks_module.REQUIRED[item]}}, item


@pytest.mark.parametrize("where", ["test project", "repository defaults"])
def test_dagster_definitions_validate(project, tmp_path, where):
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home")}
    (tmp_path / "home").mkdir()
    if where == "test project":
        env.update(project.env())
    out = subprocess.run([str(DAGSTER), "definitions", "validate", "-w", "workspace.yaml"], cwd=PROJECT_ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "All code locations passed validation" in out.stdout + out.stderr


def test_a_gpu_track_gets_the_local_gpu_runner_and_replay_wins(project):
    """TICA_GPU_TRACKS puts a track's legs on this machine's GPUs; a track also named in
    TICA_REPLAY keeps replaying (the control: the same track without the setting uses the CPU runner)."""
    from dataclasses import replace

    from resources import CpuLegRunner, LocalGpuLegRunner, ReplayLegRunner
    from tica_assets.keys import leg_runner_key

    def runner(settings):
        defs = build_defs(settings)
        node = defs.resolve_asset_graph().get(evidence_key(TRACK, EvidenceItem.FORWARD))
        keys = node.assets_def.required_resource_keys
        key = next(k for k in keys if k.startswith("leg_runner"))
        return defs.resources[key]

    plain = replace(project.settings, replay={}, gpu=frozenset())
    assert isinstance(runner(plain), CpuLegRunner)
    on_gpu = replace(plain, gpu=frozenset({TRACK}))
    assert isinstance(runner(on_gpu), LocalGpuLegRunner)
    assert leg_runner_key(TRACK, True) in build_defs(on_gpu).resources
    both = replace(on_gpu, replay={TRACK: PROJECT_ROOT / "tests" / "fixtures" / "receipts"})
    assert isinstance(runner(both), ReplayLegRunner)
