"""The crossed pairing, defined once: which order each round runs in and which arm that puts first.

A pairing order names, per round, whether arm A runs in slot 1 (AB) or slot 2 (BA); A is the
question's `arm_a`, B the other arm. Rounds alternate AB/BA/AB ... and retest rounds past the
frozen ones keep alternating. Standard library only: the GPU producers plan their rounds with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

Order = Literal["AB", "BA"]
Arm = Literal["bi1", "bi0"]


def other_order(order: str) -> Order:
    return "BA" if order == "AB" else "AB"


def other_arm(arm: str) -> Arm:
    return "bi0" if arm == "bi1" else "bi1"


def is_crossed(pairing_order: Sequence[str]) -> bool:
    """No two consecutive rounds in the same order."""
    return all(a != b for a, b in zip(pairing_order, pairing_order[1:]))


def round_order(pairing_order: Sequence[str], round_no: int) -> str:
    """The frozen order of round r (r >= 1); retest rounds past the frozen ones keep alternating.
    Rounds are numbered from 1: r < 1 is no round of the frozen order (never an index from its end)."""
    if round_no < 1:
        raise ValueError(f"round {round_no}: rounds are numbered from 1")
    if round_no <= len(pairing_order):
        return pairing_order[round_no - 1]
    last = pairing_order[-1] if pairing_order else "AB"
    return last if (round_no - len(pairing_order)) % 2 == 0 else other_order(last)


def crossed(n: int, first: str = "AB") -> list[str]:
    """AB/BA/AB ... of length n, starting with `first`."""
    return [round_order((first,), r) for r in range(1, n + 1)]


def round_arms(pairing_order: Sequence[str], arm_a: Arm, round_no: int) -> tuple[Arm, Arm]:
    """The arms of round r in slot order: A first where the round's order is AB."""
    b = other_arm(arm_a)
    return (arm_a, b) if round_order(pairing_order, round_no) == "AB" else (b, arm_a)
