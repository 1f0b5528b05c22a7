"""The false-pass suite's starting points (issue 10, "No false pass").

Every test starts from a receipt set that passes for one candidate (the negative control, checked
in the `bound` fixture before anything is broken), breaks exactly one thing the practice forbids,
and asserts that the verdict is not `pass` and that a reason names what was broken.

Mutations come in two kinds: resealed (`tica.canaries.edit_meta` / `edit_jsonl` / `edit_json` ...:
a receipt an honest producer could have sealed) and tampered (a file edited after sealing).
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.bound_receipts import build_bound
from tests.manifests import BASE_MANIFEST
from tests.manifests import H200_SHAPED as H200_SHAPED_BASE
from tica.binding import Candidate
from tica.canaries import default_questions
from tica.evidence import EvidenceItem
from tica.judges import judge, load_candidate
from tica.question import Question, parse_question
from tica.verdict import Verdict, VerdictCell

E = EvidenceItem
ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "tests" / "fixtures" / "h200"
RECEIPTS = ROOT / "tests" / "fixtures" / "receipts"
H200_MANIFEST = ROOT / "demo" / "candidates" / "h200-mid4.yaml"
H200_QUESTIONS = ROOT / "demo" / "questions" / "h200-mid4"

COMMIT = BASE_MANIFEST["source"]["commit"]
OTHER_WEIGHTS = "blake3:" + "77" * 32

# The candidate the synthetic sets are bound to (tests/manifests.py).
H200_SHAPED: dict[str, Any] = {**copy.deepcopy(H200_SHAPED_BASE), "track": "false-pass"}


@pytest.fixture(autouse=True)
def _fingerprint_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TICA_CACHE_DIR", str(tmp_path / "fingerprint-cache"))


def manifest_data(**over: Any) -> dict[str, Any]:
    data = copy.deepcopy(H200_SHAPED)
    data.update(copy.deepcopy(over))
    return data


def write_manifest(folder: Path, data: dict[str, Any], name: str = "candidate.yaml",
                   weights: bytes = bytes(range(256)) * 64) -> Path:
    """A manifest in `folder` with its checkpoint (ckpt/) beside it."""
    ckpt = folder / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "model.safetensors").write_bytes(weights)
    (ckpt / "config.json").write_text('{"hidden_size": 64}')
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def make_candidate(tmp_path) -> Callable[..., Candidate]:
    """make_candidate(name="a", weights=..., **manifest overrides) -> a Candidate."""

    def make(name: str = "cand", weights: bytes = bytes(range(256)) * 64, **over: Any) -> Candidate:
        return load_candidate(write_manifest(tmp_path / name, manifest_data(**over), weights=weights))

    return make


@pytest.fixture
def candidate(make_candidate) -> Candidate:
    return make_candidate()


@pytest.fixture(scope="session")
def questions() -> dict[EvidenceItem, Question]:
    return default_questions()


def question_with(q: Question, criteria: dict[str, Any] | None = None, **over: Any) -> Question:
    data = q.model_dump(mode="json")
    data.update(over)
    data["criteria"].update(criteria or {})
    return parse_question(data)


@pytest.fixture
def bound(tmp_path, candidate, questions) -> Callable[..., list[Path]]:
    """bound(item[, question, candidate]) -> a sealed receipt set recording the candidate, after
    checking that it passes unmutated (every test's negative control)."""
    n = [0]

    def build(item: EvidenceItem, question: Question | None = None, cand: Candidate | None = None) -> list[Path]:
        n[0] += 1
        q = question or questions[item]
        c = cand or candidate
        legs = build_bound(item, q, c, tmp_path / f"{item.value}-{n[0]}", compress=False)
        control = judge(item, q, legs, c)
        assert control.verdict is Verdict.PASS, ("negative control: the unmutated set must pass", control.reasons)
        return legs

    return build


# ---------------------------------------------------------------------------- reading a cell


def all_reasons(cell: VerdictCell) -> str:
    return "\n".join([*cell.reasons, *(b["reason"] for b in cell.numbers.get("binding", []))])


def assert_no_pass(cell: VerdictCell, *names: str, pattern: str | None = None) -> None:
    """Not `pass`, and every one of `names` (or the regex `pattern`) appears in a reason."""
    text = all_reasons(cell)
    assert cell.verdict is not Verdict.PASS, f"FALSE PASS: {cell.summary}\n{text}"
    for name in names:
        assert name in text, f"no reason names {name!r}:\n{text}"
    if pattern is not None:
        assert re.search(pattern, text, re.IGNORECASE), f"no reason matches {pattern!r}:\n{text}"


def binding_problems(cell: VerdictCell, field: str, kind: str | None = None) -> list[dict[str, Any]]:
    return [b for b in cell.numbers.get("binding", [])
            if b.get("field") == field and (kind is None or b.get("kind") == kind)]


def assert_unbound(cell: VerdictCell, field: str, kind: str) -> None:
    """Not `pass`, and the binding list names `field` as `kind` (differs / unrecorded)."""
    assert cell.verdict is not Verdict.PASS, f"FALSE PASS: {cell.summary}\n{all_reasons(cell)}"
    found = binding_problems(cell, field, kind)
    assert found, f"no binding problem ({field}, {kind}) in {cell.numbers.get('binding')}"
    assert any(field in r and ("not evidence for this candidate" in r) for r in cell.reasons), cell.reasons


# ---------------------------------------------------------------------------- receipts


def load(path: Path) -> Any:
    return json.loads(path.read_text())


def leg_of(legs: Sequence[Path], **want: Any) -> Path:
    for leg in legs:
        meta = load(leg / "leg.json")
        if all(meta.get(k) == v for k, v in want.items()):
            return leg
    raise LookupError(want)


def drop_key(data: dict[str, Any], dotted: str) -> None:
    node: Any = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node[part]
    del node[parts[-1]]


def set_key(data: dict[str, Any], dotted: str, value: Any) -> None:
    node: Any = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def copy_legs(sources: Sequence[Path], dest: Path) -> list[Path]:
    out = []
    for src in sources:
        dst = dest / src.parent.name / src.name
        shutil.copytree(src, dst)
        out.append(dst)
    return out


def utcnow() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def false_pass(why: str) -> pytest.MarkDecorator:
    """A pass this suite found the system gives and should not: kept red-in-waiting (strict
    xfail) until the rule exists; then it XPASSes, fails, and the marker must go."""
    return pytest.mark.xfail(strict=True, reason=f"FALSE PASS found by tests/false_pass: {why}")

