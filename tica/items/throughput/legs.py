"""The legs a throughput question calls for: per round, the round's pair in its crossed pairing
order (tica.pairing, read through Question.round_arms); each leg runs every concurrency of the
question (one sealed sub-leg per concurrency, each warmed up on its own), run by
resources/legs.py's runners."""

from __future__ import annotations

from tica.question import Question


def plan_arms(question: Question) -> list[tuple[str, int, int]]:
    """(arm, slot, round) of each leg, in the frozen order: round by round, slot by slot."""
    return [(arm, slot, r) for r in range(1, len(question.pairing_order) + 1)
            for slot, arm in enumerate(question.round_arms(r), start=1)]
