"""The artifacts' canaries: a passing receipt set (the sealed legs of a passing forward and update,
built by those items' own builders, read through the registry) and one planted error per rule,
each of which the judge must not pass. `tica.canaries` runs them with every other item's."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tica.canary_legs import FAIL, Canary, edit_meta
from tica.evidence import EvidenceItem
from tica.items.registry import default_question, room
from tica.question import Question
from tica.verdict import Verdict

E = EvidenceItem

# The question the built-in canaries and the committed fixtures are judged under.
QUESTION: dict[str, Any] = {
    "name": "immutable-artifacts", "compared": "seals and weight names",
    "computation": "re-hash every sealed file", "pass_line": "all sealed, weights by content hash",
    "criteria": {"item": "artifacts"}}


def build_artifacts(question: Question, dest: Path) -> list[Path]:
    """The legs of a passing forward and update, each under its item's default canary question
    (their builders and questions are the registry's, never imported from another room)."""
    return [leg for item in (E.FORWARD, E.UPDATE) for leg in room(item).builder()(default_question(item), dest)]


def tamper(q: Question, legs: list[Path]) -> None:
    # A receipt edited after sealing, without resealing: exactly what the seal exists to catch.
    p = legs[0] / "metrics.jsonl"
    p.write_text(p.read_text().replace('"step": 1,', '"step": 1, "edited": true,', 1))


def nothing_ran(q: Question, legs: Sequence[Path]) -> None:
    for leg in legs:
        edit_meta(leg, lambda m: m.update(not_run_reason="planted: the producer did not run this leg"))


# The must_record canary every item has is tica.canaries' (it reads the question, not the item).
CANARIES: tuple[Canary, ...] = (
    Canary("artifacts.sealed", E.ARTIFACTS, "receipts immutable: a file changed after sealing", FAIL, tamper),
    Canary("artifacts.weights_by_hash", E.ARTIFACTS, "weights named by content hash", FAIL,
           lambda q, legs: edit_meta(legs[0], lambda m: m["resolved_config"].update(weights_hash="Qwen3-8B"))),
    Canary("artifacts.something_ran", E.ARTIFACTS, "legs that did not run name no artifact", frozenset({Verdict.NOT_RUN}),
           nothing_ran),
)
