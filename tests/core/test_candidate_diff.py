"""`tica candidate diff`: each component change maps to the evidence the matrix says it voids."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.core.conftest import write_manifest
from tica.candidate import diff, identify_file, voided_items
from tica.cli import main
from tica.evidence import INVALIDATION_MATRIX, Component, EvidenceItem, sensitive_components

Mutation = Callable[[dict[str, Any]], None]

MUTATIONS: dict[Component, Mutation] = {
    Component.IMAGE: lambda m: m["image"].update(digest="sha256:" + "ef" * 32),
    Component.SOURCE: lambda m: m["source"].update(commit="fedcba9876543210"),
    Component.HARDWARE: lambda m: m["hardware"].update(accelerator="NVIDIA H200"),
    Component.RUNNER: lambda m: m["runner"]["parallelism"].update(tp=2),
    Component.PRECISION: lambda m: m["precision"].update(kv_cache="fp8_e4m3"),
    Component.BACKENDS: lambda m: m["backends"].update(attention="TRITON_ATTN"),
    Component.GRAPH_CACHE: lambda m: m["graph_cache"].update(prefix_caching=True),
    Component.RECIPE: lambda m: m["recipe"].update(bi0=m["recipe"]["bi0"] + " --seed 1"),
    Component.EVAL_CONTRACT: lambda m: m["eval_contract"].update(scorer="math-verify==0.9.0"),
    Component.WORKLOAD: lambda m: m["workload"].update(output_len=32),
}


def _pair(candidate_dir, manifest_data, mutate: Mutation):
    old = write_manifest(candidate_dir, manifest_data, "old.yaml")
    changed = copy.deepcopy(manifest_data)
    mutate(changed)
    new = write_manifest(candidate_dir, changed, "new.yaml")
    return identify_file(old), identify_file(new)


@pytest.mark.parametrize("component", list(MUTATIONS), ids=lambda c: c.value)
def test_each_component_change_voids_exactly_its_matrix_row(candidate_dir, manifest_data, component):
    old, new = _pair(candidate_dir, manifest_data, MUTATIONS[component])
    changes = diff(old, new)
    assert [c.component for c in changes] == [component]
    assert changes[0].invalidates == INVALIDATION_MATRIX[component][0]
    assert old.candidate_id != new.candidate_id


def test_new_weights_void_everything(candidate_dir, manifest_data):
    path = write_manifest(candidate_dir, manifest_data)
    old = identify_file(path)
    (candidate_dir / "ckpt" / "model.safetensors").write_bytes(b"\x01" + bytes(range(256)) * 64)
    changes = diff(old, identify_file(path))
    assert [c.component for c in changes] == [Component.WEIGHTS]
    assert set(voided_items(changes)) == set(EvidenceItem)


def test_scorer_change_voids_quality_not_numerics(candidate_dir, manifest_data):
    old, new = _pair(candidate_dir, manifest_data, MUTATIONS[Component.EVAL_CONTRACT])
    voided = voided_items(diff(old, new))
    assert EvidenceItem.QUALITY in voided
    assert not {EvidenceItem.FORWARD, EvidenceItem.BACKWARD, EvidenceItem.UPDATE, EvidenceItem.THROUGHPUT} & set(voided)


def test_workload_change_voids_throughput_not_quality(candidate_dir, manifest_data):
    old, new = _pair(candidate_dir, manifest_data, MUTATIONS[Component.WORKLOAD])
    voided = voided_items(diff(old, new))
    assert EvidenceItem.THROUGHPUT in voided and EvidenceItem.QUALITY not in voided


def test_a_model_name_alone_is_not_an_identity(candidate_dir, manifest_data):
    """Editing only the informational image tag leaves the candidate unchanged."""
    old, new = _pair(candidate_dir, manifest_data, lambda m: m["image"].update(reference="renamed:latest"))
    assert diff(old, new) == [] and old.candidate_id == new.candidate_id


def test_matrix_and_its_inverse_agree():
    for item in EvidenceItem:
        for component in Component:
            assert (component in sensitive_components(item)) == (item in INVALIDATION_MATRIX[component][0])


def test_cli_diff_prints_component_and_voided_items(candidate_dir, manifest_data, capsys):
    _pair(candidate_dir, manifest_data, MUTATIONS[Component.WORKLOAD])
    assert main(["candidate", "diff", str(candidate_dir / "old.yaml"), str(candidate_dir / "new.yaml")]) == 0
    out = capsys.readouterr().out
    assert "workload" in out and "throughput" in out and "quality" not in out.split("voided evidence:")[1]


# ---- a name where content is the identity (issue 28, class 2)


def test_editing_a_file_the_manifest_names_changes_exactly_its_component(tmp_path, monkeypatch):
    import yaml

    from tests.false_pass.conftest import manifest_data, write_manifest
    from tica.candidate import diff, identify
    from tica.evidence import Component
    from tica.manifest import load_manifest

    monkeypatch.setenv("TICA_CACHE_DIR", str(tmp_path / "cache"))
    data = manifest_data()
    data["eval_contract"]["prompt_template"] = "chat_template templates/chat.jinja"
    data["recipe"]["bi1"] = "VLLM_BATCH_INVARIANT=1 vllm serve /m --chat-template=templates/chat.jinja"
    path = write_manifest(tmp_path / "m", data)
    (tmp_path / "m" / "templates").mkdir()
    template = tmp_path / "m" / "templates" / "chat.jinja"
    template.write_text("{{ messages }}")
    before = identify(load_manifest(path))
    assert set(load_manifest(path).named_files) == {Component.EVAL_CONTRACT, Component.RECIPE}
    template.write_text("{{ messages }}<think>")
    after = identify(load_manifest(path))
    assert {c.component for c in diff(before, after)} == {Component.EVAL_CONTRACT, Component.RECIPE}
    # control: a name that is no file under the manifest's folder stays text, and hashes as before
    data["eval_contract"]["prompt_template"] = "chat_template sha256:872be49d"
    data["recipe"]["bi1"] = "VLLM_BATCH_INVARIANT=1 vllm serve /m"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    assert load_manifest(path).named_files == {}
