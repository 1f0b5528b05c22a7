"""The shipped problem sets: reproducible from their generator, versioned by their bytes, and
arith1000 large enough for the quality plan to decide a 5-point threshold."""

from __future__ import annotations

from tica.problems import load_problems, problem_set_path
from tica.problems.generate import text
from tica.stats.quality import problems_needed


def test_arith1000_is_what_its_generator_writes():
    assert problem_set_path("arith1000").read_text() == text("arith1000")


def test_a_set_is_versioned_by_its_bytes(tmp_path):
    version, rows = load_problems("arith1000")
    assert len(rows) == 1000 and len({r["problem_id"] for r in rows}) == 1000
    edited = tmp_path / "arith1000.jsonl"
    edited.write_text(problem_set_path("arith1000").read_text().replace('"132"', '"133"', 1))
    assert load_problems(str(edited))[0] != version  # negative control: one answer changed, a new version


def test_arith1000_decides_a_five_point_threshold_and_arith30_cannot():
    """No true difference, 10% of problems disagreeing, alpha 0.05, power 0.8 (docs/statistics.md)."""
    needed = problems_needed(threshold=0.05, margin=0.05, discordance=0.10, alpha=0.05, power=0.8)
    assert needed is not None and needed <= len(load_problems("arith1000")[1])
    assert needed > len(load_problems("arith30")[1])
