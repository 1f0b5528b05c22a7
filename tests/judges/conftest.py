"""Fixtures for the judges' tests: a fresh copy of a sealed, passing receipt set per test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tica.evidence import EvidenceItem
from tica.question import Question, load_question, parse_question

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "receipts"


def question(item: str, **criteria_over) -> Question:
    q = load_question(FIXTURES / "questions" / f"{item}.yaml")
    if not criteria_over:
        return q
    data = q.model_dump(mode="json")
    data["criteria"].update(criteria_over)
    return parse_question(data)


def with_question(q: Question, **over) -> Question:
    data = q.model_dump(mode="json")
    data.update(over)
    return parse_question(data)


@pytest.fixture
def receipts(tmp_path):
    """receipts("forward") -> list of leg paths, copied so a test may plant errors in them."""

    def copy(item: str) -> list[Path]:
        src = FIXTURES / item
        dst = tmp_path / item
        shutil.copytree(src, dst)
        return sorted(p for p in dst.iterdir())

    return copy


def leg(paths, name_part: str) -> Path:
    [p] = [p for p in paths if name_part in p.name]
    return p


ITEMS = EvidenceItem
