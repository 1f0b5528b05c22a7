"""The pictures are PNGs drawn from the same numbers the judges and the plan use."""

from __future__ import annotations

from tica.stats.plots import per_round_loss_png, plan_curve_png, quality_table_md

PNG = b"\x89PNG\r\n\x1a\n"


def test_per_round_loss_is_a_png_with_and_without_enough_rounds_for_a_band():
    assert per_round_loss_png({8: [0.02, 0.05, 0.03, 0.04, 0.06], 32: [0.1, 0.2]}, {8: 0.1, 32: 0.15},
                              0.05).startswith(PNG)
    assert per_round_loss_png({}, {}, 0.05).startswith(PNG)


def test_the_plan_curve_is_a_png():
    assert plan_curve_png({8: 0.02, 64: 0.05}, {8: 0.04, 64: 0.06}, 0.05, 0.8, budget={8: 0.1}).startswith(PNG)


def test_the_quality_2x2_sums_to_n():
    md = quality_table_md(20, 1, 2, 7)
    assert "| BI=1 correct | 20 | 1 | 21 |" in md and "| BI=1 wrong | 2 | 7 | 9 |" in md
    assert md.splitlines()[-1] == "| total | 22 | 8 | 30 |"
