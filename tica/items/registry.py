"""One registry of the evidence items: for each, where its criteria model, judge, canaries, leg
plan and extra checks live. The judges' entry point (tica.judges.JUDGES), the canary table
(tica.canaries), the checks an accepted verdict carries (tica.checks.REQUIRED), the leg plan
(resources/legs.py), the command line and the Dagster assets read it.

Every item has a room (`folder`): its pieces live in tica/items/<item>/ under the rooms' names
(`_room`), and every reader asks this one place for them. The optional fields let an entry name
pieces kept elsewhere (None: tica.canaries' table, resources/legs.py's plan). Pieces are named as "module:attribute" and
imported on first use: the registry itself imports only the item enum, so any module may read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any

from tica.evidence import EvidenceItem

E = EvidenceItem


def resolve(ref: str) -> Any:
    """The object a "module:attribute" reference names."""
    module, _, name = ref.partition(":")
    return getattr(import_module(module), name)


@dataclass(frozen=True)
class ItemRoom:
    item: EvidenceItem
    folder: str | None  # its room, relative to the repository; None: no room (none today)
    criteria: str  # its criteria model, one arm of tica.question.Criteria
    judge: str  # (question, leg paths) -> VerdictCell
    canary_builder: str  # (question, dest) -> the passing receipt set its canaries mutate
    own_canaries: str | None = None  # its planted errors, in its room; None: its rows of tica.canaries.CANARIES
    canary_question: str | None = None  # the question its canaries run under (raw); None: tica.canaries' own
    leg_plan: str | None = None  # question -> [(arm, slot)] or [(arm, slot, round)]; None: resources/legs.py decides
    extra_checks: tuple[str, ...] = ()  # checks beyond those every verdict carries (names in tica.checks)

    def judge_fn(self) -> Any:
        return resolve(self.judge)

    def criteria_model(self) -> Any:
        return resolve(self.criteria)

    def builder(self) -> Any:
        return resolve(self.canary_builder)

    def room_canaries(self) -> tuple[Any, ...]:
        return tuple(resolve(self.own_canaries)) if self.own_canaries else ()

    def canaries(self) -> tuple[Any, ...]:
        """Every canary run for this item (tica.canaries.CANARIES, its room's included)."""
        return tuple(c for c in resolve("tica.canaries:CANARIES") if c.item is self.item)


def _room(item: EvidenceItem, criteria: str, extra_checks: tuple[str, ...] = ()) -> ItemRoom:
    """An item whose room holds every piece under the rooms' names (criteria, judge, canaries, legs)."""
    here = f"tica.items.{item.value}"
    return ItemRoom(item, f"tica/items/{item.value}", f"{here}.criteria:{criteria}", f"{here}.judge:judge_{item.value}",
                    f"{here}.canaries:build_{item.value}", own_canaries=f"{here}.canaries:CANARIES",
                    canary_question=f"{here}.canaries:QUESTION", leg_plan=f"{here}.legs:plan_arms",
                    extra_checks=extra_checks)


ROOMS: dict[EvidenceItem, ItemRoom] = {
    E.FORWARD: _room(E.FORWARD, "ForwardCriteria"),
    E.BACKWARD: _room(E.BACKWARD, "BackwardCriteria"),
    E.UPDATE: _room(E.UPDATE, "UpdateCriteria"),
    E.QUALITY: _room(E.QUALITY, "QualityCriteria", extra_checks=("quality_sums",)),
    E.THROUGHPUT: _room(E.THROUGHPUT, "ThroughputCriteria", extra_checks=("workload_receipts",)),
    E.CLEAN_EXIT: _room(E.CLEAN_EXIT, "CleanExitCriteria"),
    E.ARTIFACTS: _room(E.ARTIFACTS, "ArtifactsCriteria"),
}
assert tuple(ROOMS) == tuple(EvidenceItem), "one entry per evidence item, in the enum's order"


def room(item: EvidenceItem | str) -> ItemRoom:
    return ROOMS[EvidenceItem(item)]


def default_question(item: EvidenceItem | str) -> Any:
    """The question `item`'s canaries and the committed fixtures are built for (tica.canaries'
    table, which holds the rooms' own): how one room's builder reaches another item's question."""
    return resolve("tica.canaries:default_questions")()[EvidenceItem(item)]


def rooms() -> tuple[ItemRoom, ...]:
    return tuple(ROOMS.values())


def item_names() -> tuple[str, ...]:
    return tuple(r.item.value for r in rooms())
