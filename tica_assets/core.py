"""The Dagster layer's small helpers over the core: finding a track's question, and the loose
receipt readings the plots and tables need (docs/receipts.md)."""

from __future__ import annotations

import json
from pathlib import Path

from tica.errors import QuestionError
from tica.evidence import EvidenceItem
from tica.question import load_question

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


def track_questions(questions_dir: Path, track: str) -> list[Path]:
    """Every item's question file for a track (those that can be found now)."""
    found = []
    for item in EvidenceItem:
        try:
            found.append(find_question(questions_dir, track, item))
        except QuestionError:
            continue
    return found


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
