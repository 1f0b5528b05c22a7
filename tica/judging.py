"""What every judge shares: verdict ordering, a collector of findings, markdown tables."""

from __future__ import annotations

import ast
import hashlib
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tica.evidence import EvidenceItem
from tica.messages import relative, without_prefix
from tica.question import Question
from tica.verdict import Verdict, VerdictCell

# A judge's version is the hash of the code that reads receipts and judges them: every judge
# module and, transitively, every `tica` module they import (metrics, seals, questions ...), found
# by reading their import statements. A change anywhere a judge reads is a new version by
# construction, and old cells keep the version they were judged under.
_ROOTS = ("judging.py", "confounders.py", "judges/*.py", "items/registry.py", "items/*/judge.py", "binding.py")


def _tica_imports(path: Path, root: Path) -> set[Path]:
    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
        for name in names:
            if name == "tica" or not name.startswith("tica."):
                continue
            rel = Path(*name.split(".")[1:])
            for candidate in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
                if candidate.is_file():
                    found.add(candidate)
    return found


def judge_sources() -> list[Path]:
    """Every source file a judge's verdict depends on (the judges and their tica imports)."""
    root = Path(__file__).resolve().parent
    todo = {p for pattern in _ROOTS for p in root.glob(pattern)}
    seen: set[Path] = set()
    while todo:
        p = todo.pop()
        seen.add(p)
        todo |= _tica_imports(p, root) - seen
    return sorted(seen)


def _source_hash() -> str:
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for p in judge_sources():
        h.update(p.relative_to(root).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


JUDGE_VERSION = f"tica.judges/1+{_source_hash()}"

_SEVERITY = {Verdict.PASS: 0, Verdict.NOT_RUN: 1, Verdict.INCONCLUSIVE: 2, Verdict.FAIL: 3}


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """fail > inconclusive > not run > pass; nothing at all is `not run`."""
    vs = list(verdicts)
    return max(vs, key=_SEVERITY.__getitem__) if vs else Verdict.NOT_RUN


class Findings:
    """Collects what a judge found; the verdict is the worst finding, pass when none."""

    def __init__(self) -> None:
        self.items: list[tuple[Verdict, str]] = []

    def fail(self, reason: str) -> None:
        self.items.append((Verdict.FAIL, reason))

    def inconclusive(self, reason: str) -> None:
        self.items.append((Verdict.INCONCLUSIVE, reason))

    def not_run(self, reason: str) -> None:
        self.items.append((Verdict.NOT_RUN, reason))

    def note(self, reason: str) -> None:
        self.items.append((Verdict.PASS, reason))

    def extend(self, other: "Findings", prefix: str = "") -> None:
        self.items.extend((v, prefix + r) for v, r in other.items)

    @property
    def verdict(self) -> Verdict:
        return worst(v for v, _ in self.items) if self.items else Verdict.PASS

    def reasons(self) -> tuple[str, ...]:
        # Worst first, so the first reason is the one that decided the cell.
        ordered = sorted(self.items, key=lambda vr: -_SEVERITY[vr[0]])
        return tuple(prefixed("note" if v is Verdict.PASS else v.value, r) for v, r in ordered)

    def deciding(self) -> str | None:
        """The reason that decided the verdict (the first of the worst), without its prefix; None
        when nothing was found."""
        ordered = sorted(self.items, key=lambda vr: -_SEVERITY[vr[0]])
        return shown(ordered[0][1]) if ordered else None


def shown(text: str) -> str:
    """A reason or summary as a person reads it: no verdict prefix of its own (the cell adds one),
    receipt paths relative (tica.messages.relative)."""
    return relative(without_prefix(str(text)))


def prefixed(word: str, text: str) -> str:
    """`word: text`, once: a text that already carries a verdict prefix is not prefixed again."""
    return f"{word}: {shown(text)}"


def led(findings: Findings, summary: str, when: Sequence[Verdict] = (Verdict.FAIL, Verdict.INCONCLUSIVE,
                                                                     Verdict.NOT_RUN)) -> str:
    """A summary whose headline is not contradicted by its body: for a verdict in `when`, the reason
    that decided it leads ("fail: forward_bi1: weights named ...; 3 of 3 receipts sealed")."""
    why = findings.deciding() if findings.verdict in when else None
    return f"{why}; {summary}" if why else summary


def did_not_run(label: str, reason: object) -> str:
    """Why a leg did not run, as its producer recorded it (a recorded 'not run: ' is not repeated)."""
    return f"{label}did not run: {shown(str(reason))}"


def leg_label(leg: Any) -> str:
    """How a finding names the leg it is about: its arm and folder ("bi1 forward_bi1: ")."""
    return f"{leg.arm} {leg.path.name}: "


def skipped_leg(item: EvidenceItem, leg: Any, findings: Findings, judged: bool = True) -> bool:
    """Every judge's first look at a leg: another item's leg is inconclusive, a leg that did not run
    is not run (a note when the question does not judge its arm). True: judge it no further."""
    label = leg_label(leg)
    if leg.meta.item != item.value:
        article = "an" if item.value[0] in "aeiou" else "a"
        findings.inconclusive(f"{label}is a {leg.meta.item} leg, not {article} {item.value} leg")
        return True
    if leg.meta.not_run_reason:
        (findings.not_run if judged else findings.note)(did_not_run(label, leg.meta.not_run_reason))
        return True
    return False


def cell(
    item: EvidenceItem,
    question: Question,
    findings: Findings,
    summary: str,
    numbers: dict[str, Any] | None = None,
    tables: dict[str, str] | None = None,
    receipt_hashes: dict[str, str] | None = None,
    verdict: Verdict | None = None,
) -> VerdictCell:
    v = verdict if verdict is not None else findings.verdict
    return VerdictCell(
        item=item,
        verdict=v,
        summary=prefixed(v.value, summary),
        question_hash=question.hash,
        reasons=findings.reasons(),
        numbers=numbers or {},
        tables=tables or {},
        receipt_hashes=receipt_hashes or {},
        judge_version=JUDGE_VERSION,
    )


def without_pass(result: VerdictCell, why: Sequence[str]) -> VerdictCell:
    """A cell these reasons forbid to pass: a pass becomes inconclusive, the first reason leading its
    summary; any other verdict stays what the criteria found, the reasons added as notes."""
    if not why:
        return result
    if result.verdict is not Verdict.PASS:
        return result.model_copy(update={"reasons": (*result.reasons, *(prefixed("note", w) for w in why))})
    return result.model_copy(update={
        "verdict": Verdict.INCONCLUSIVE, "reasons": (*(prefixed("inconclusive", w) for w in why), *result.reasons),
        "summary": prefixed("inconclusive", f"{shown(why[0])}; {criteria_alone(result.summary)}")})


def criteria_alone(summary: str) -> str:
    """What the criteria found, quoted after the reason that forbids their pass (no second verdict
    prefix: 'the criteria alone pass, with ...')."""
    return f"the criteria alone pass, with {shown(summary)}"


def fmt(x: Any) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return str(x)
        if x == 0:
            return "0"
        return f"{x:.6g}"
    return str(x).replace("|", "\\|")


def md_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def wrong_question_cell(item: EvidenceItem, question: Question) -> VerdictCell | None:
    """Every judge's first look: a question of another item is an inconclusive cell that says so,
    judged before any leg is read; None when the question is the item's own."""
    if question.item is item:
        return None
    bad = f"question {question.name!r} is for {question.item.value}, not {item.value}"
    findings = Findings()
    findings.inconclusive(bad)
    return cell(item, question, findings, bad)
