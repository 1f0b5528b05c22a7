"""Exact staleness as shipped: in a git clone of this repository, editing the demo manifest's
scorer changes exactly the eval_contract component (so voids exactly what the invalidation
matrix names for it), reverting gives the same candidate back, and an edit of code in the
clone is a source change (the control: `.tica-source-ignore` leaves out only what it names)."""

from __future__ import annotations

import subprocess

import pytest

from tica.candidate import diff, identify_file, voided_items
from tica.evidence import Component, invalidated_by
from tica.models.tiny import build_tiny_llama
from tica_assets.settings import PROJECT_ROOT

MANIFEST = "demo/candidates/cpu-tiny.yaml"


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    if subprocess.run(["git", "-C", str(PROJECT_ROOT), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("the project is not a git checkout")
    root = tmp_path_factory.mktemp("clone") / "tica"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(PROJECT_ROOT), str(root)], check=True)
    build_tiny_llama(root / "data" / "models" / "tiny-llama")  # data/ is ignored: the demo builds it
    return root


def _edit(path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def test_a_scorer_edit_voids_exactly_the_scorers_items_and_reverting_restores_the_candidate(clone):
    manifest = clone / MANIFEST
    before = identify_file(manifest)
    assert "+dirty" not in str(before.components)  # a fresh clone: the source is its HEAD
    _edit(manifest, 'scorer: "tica.scorer.boxed/1', 'scorer: "tica.scorer.boxed/2')
    edited = identify_file(manifest)
    changes = diff(before, edited)
    assert [c.component for c in changes] == [Component.EVAL_CONTRACT]
    assert set(voided_items(changes)) == set(invalidated_by(Component.EVAL_CONTRACT))
    _edit(manifest, 'scorer: "tica.scorer.boxed/2', 'scorer: "tica.scorer.boxed/1')
    assert identify_file(manifest).candidate_id == before.candidate_id


def test_control_a_code_edit_in_the_clone_is_a_source_change(clone):
    before = identify_file(clone / MANIFEST)
    code = clone / "tica" / "unknowns.py"
    original = code.read_text()
    try:
        code.write_text(original + "\n# an edit of code the legs import\n")
        changes = diff(before, identify_file(clone / MANIFEST))
        assert [c.component for c in changes] == [Component.SOURCE]
    finally:
        code.write_text(original)
    assert identify_file(clone / MANIFEST).candidate_id == before.candidate_id
