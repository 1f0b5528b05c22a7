"""The legs a quality question calls for: one per arm, in the first round's order, each an
evaluation of the same problems under the same contract (run by resources/legs.py's runners)."""

from __future__ import annotations

from tica.question import Question


def plan_arms(question: Question) -> list[tuple[str, int]]:
    """(arm, slot) of each leg, in the frozen order."""
    return [(arm, slot) for slot, arm in enumerate(question.round_arms(1), start=1)]
