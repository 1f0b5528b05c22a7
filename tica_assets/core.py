"""The Dagster layer's calls into the core, in one place: questions, judges, canaries, and the
small receipt readings the checks and plots need (docs/receipts.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tica.errors import QuestionError
from tica.evidence import EvidenceItem
from tica.question import Question, load_question
from tica.verdict import VerdictCell

QUESTION_SUFFIXES = (".yaml", ".yml")


# ---------------------------------------------------------------------------- questions


def find_question(questions_dir: Path, track: str, item: EvidenceItem) -> Path:
    """The one question file for a track's item: `<dir>/<track>/` first, then `<dir>/`.

    Two files for one item in the same folder is an error (which one was frozen would depend
    on file order); a malformed file is named when no question for the item is found."""
    malformed: list[str] = []
    for folder in (questions_dir / track, questions_dir):
        if not folder.is_dir():
            continue
        found: list[Path] = []
        for path in sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in QUESTION_SUFFIXES):
            try:
                q = load_question(path)
            except QuestionError as err:
                malformed.append(str(err))
                continue
            if q.item is item:
                found.append(path)
        if len(found) > 1:
            raise QuestionError(folder, "item", f"{len(found)} questions for {item.value}: {[p.name for p in found]}")
        if found:
            return found[0]
    detail = f"; malformed: {'; '.join(malformed)}" if malformed else ""
    raise QuestionError(questions_dir, "item", f"no question for {item.value} (track {track}){detail}")


# ---------------------------------------------------------------------------- judging


def judge(item: EvidenceItem, question: Question, leg_paths: list[Path]) -> VerdictCell:
    from tica import judges  # looked up at call time: tests replace tica.judges.judge

    return judges.judge(item, question, leg_paths)


# ---------------------------------------------------------------------------- canaries


@dataclass(frozen=True)
class CanaryOutcome:
    """One planted error fed to one criterion; `caught` when the criterion returned fail."""

    name: str
    caught: bool
    detail: str
    applicable: bool = True  # False: the frozen question switches this criterion off


def run_canaries(item: EvidenceItem, question: Question) -> list[CanaryOutcome]:
    """Every canary of the item's criteria, under this frozen question (`tica.canaries`). An
    empty list means no canary exists: the check turns that into a blocking failure."""
    from tica import canaries  # looked up at call time: tests replace tica.canaries

    results = canaries.run_canaries(questions={item: question}, only=[f"{item.value}."])
    return [
        CanaryOutcome(
            name=r.name,
            caught=not r.broken,
            applicable=not r.not_applicable,
            detail=r.detail if r.not_applicable
            else f"expected {'/'.join(r.expected)}, got {r.got}" + (f": {r.detail}" if r.detail else ""),
        )
        for r in results
        if r.item == item.value
    ]


# ---------------------------------------------------------------------------- receipts


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_jsonl(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return []


def leg_meta(leg_dir: Path) -> dict:
    return read_json(leg_dir / "leg.json") or {}
