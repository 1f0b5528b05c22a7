"""The legs an artifacts question calls for: none. The final artifacts are the sealed legs the
other items ran, judged as they lie (resources/legs.py runs nothing for this item)."""

from __future__ import annotations

from tica.question import Question


def plan_arms(question: Question) -> list[tuple[str, int]]:
    """(arm, slot) of each leg: none of its own."""
    return []
