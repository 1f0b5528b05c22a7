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


# The committed throughput set (fixtures/receipts/throughput) has 3 crossed rounds, and its
# committed question no statistical basis: a report-only question, which the judge never passes
# (its hash is pinned in tests/stats/test_question_basis.py). Tests that need the set to pass
# freeze this basis with it. A sign test over 3 rounds can pass only at alpha >= 0.5^3 = 0.125, so
# alpha is 0.2 here (under 0.5, as every basis must be); the sets tica.canaries builds have 5
# rounds and alpha 0.05.
FIXTURE_BASIS = {"test": "sign_test_median", "alpha": 0.2, "rounds": 3,
                 "pilot_digests": ["sha256:" + "f1" * 32],
                 "notes": ["tests: the committed synthetic rounds, not planned from a pilot"]}


def throughput_question(**criteria_over) -> Question:
    """The committed throughput question with FIXTURE_BASIS frozen (criteria overridable)."""
    return question("throughput", statistical_basis=FIXTURE_BASIS, **criteria_over)


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
