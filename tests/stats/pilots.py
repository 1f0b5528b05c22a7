"""Synthetic throughput pilots: sealed legs (the canaries' formats) with chosen per-round losses."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from tica.canaries import build_throughput, default_questions, scale_throughput
from tica.evidence import EvidenceItem
from tica.question import Question, parse_question
from tica.pairing import crossed

_NAME = re.compile(r"tput_c(\d+)_r(\d+)_s\d_(bi[01])$")


def throughput_question(rounds: int, **criteria_over) -> Question:
    """The canaries' throughput question over `rounds` crossed rounds, without its statistical
    basis (a pilot's question: `tica plan` writes the basis; criteria overridable)."""
    data = default_questions()[EvidenceItem.THROUGHPUT].model_dump(mode="json")
    data.update(repeats=rounds, pairing_order=crossed(rounds))
    data["criteria"]["statistical_basis"] = None
    data["criteria"].update(criteria_over)
    return parse_question(data)


def write_pilot(question: Question, dest: Path, losses: Mapping[int, Sequence[float]],
                bi0_factor: Mapping[int, Sequence[float]] | None = None) -> list[Path]:
    """Legs for every round of `question` whose BI=1 loss at (c, round r) is losses[c][r-1]
    (concurrencies not named keep loss 0); bi0_factor scales both arms of a round (tiers)."""
    legs = build_throughput(question, dest, loss={c: 0.0 for c in question.criteria.concurrencies})
    for leg in legs:
        c, r, arm = _NAME.search(leg.name).groups()  # type: ignore[union-attr]
        c, r = int(c), int(r)
        factor = bi0_factor[c][r - 1] if bi0_factor and c in bi0_factor else 1.0
        if arm == "bi1" and c in losses:
            factor *= 1.0 - losses[c][r - 1]
        if factor != 1.0:
            scale_throughput(leg, factor)
    return legs
