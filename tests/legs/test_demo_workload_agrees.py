"""The CPU track's manifest and its throughput question name one workload. A throughput leg runs
the question's counts (resources/legs.py leg_params) and is bound to the manifest's
(tica.binding: workload.num_prompts per concurrency), so where the two disagree no leg can be
evidence: the demo's c=1 legs ran 4 requests against a manifest pinning 8 and were unbound."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tica.evidence import EvidenceItem
from tica.manifest import Manifest
from tica.question import load_question

REPO = Path(__file__).resolve().parents[2]
CPU_TRACKS = ["cpu-tiny.yaml"]  # the H200 tracks' manifests and questions are another owner's


def disagreements(manifest: Manifest, criteria) -> list[str]:
    w, out = manifest.workload, []
    for field in ("input_len", "output_len", "ignore_eos", "warmups"):
        if getattr(criteria, field) != getattr(w, field):
            out.append(f"{field}: question {getattr(criteria, field)!r}, manifest {getattr(w, field)!r}")
    if set(w.concurrencies) != set(criteria.concurrencies):
        out.append(f"concurrencies: question {list(criteria.concurrencies)}, manifest {list(w.concurrencies)}")
    for c in criteria.concurrencies:
        asked = (criteria.num_prompts or {}).get(c)
        if asked is not None and asked != w.prompts_at(c):
            out.append(f"num_prompts at c={c}: question {asked}, manifest {w.prompts_at(c)}")
    return out


@pytest.mark.parametrize("name", CPU_TRACKS)
def test_the_cpu_manifest_and_its_throughput_question_name_one_workload(name):
    from tica_assets.core import find_question

    manifest = Manifest.model_validate(yaml.safe_load((REPO / "demo" / "candidates" / name).read_text()))
    question = load_question(find_question(REPO / "demo" / "questions", manifest.track, EvidenceItem.THROUGHPUT))
    assert disagreements(manifest, question.criteria) == []


def test_a_disagreement_is_named_field_by_field():
    """The negative control: the demo's manifest as it was (8 requests at every concurrency)."""
    data = yaml.safe_load((REPO / "demo" / "candidates" / "cpu-tiny.yaml").read_text())
    data["workload"]["num_prompts"] = 8
    question = load_question(REPO / "demo" / "questions" / "throughput.yaml")
    assert disagreements(Manifest.model_validate(data), question.criteria) == ["num_prompts at c=1: question 4, manifest 8"]
