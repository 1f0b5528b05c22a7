"""Judges: sealed receipts + a frozen question + the candidate -> a verdict cell. Pure
functions, no Dagster.

`judge(item, question, leg_paths, candidate)` is the one entry point for a verdict: the
question's criteria (`judge_criteria`), then every leg bound to the candidate (`tica.binding`).
`JUDGE_VERSION` names the code that judged (it hashes the judges and every tica module they
import, so a parser change is a new version).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from tica import digests, leg_times
from tica.binding import BindingProblem, Candidate, bind_legs, unbound_pins, workload_disagreements
from tica.errors import InputError, ReceiptError, UsageParser
from tica.evidence import EvidenceItem
from tica.judging import JUDGE_VERSION, Findings, cell, criteria_alone, prefixed, shown, without_pass
from tica.items.registry import item_names, rooms
from tica.judges.recipe_identity import RecipeIdentityResult, judge_recipe_identity
from tica.messages import clip, without_prefix
from tica.question import Question, ThroughputCriteria, load_question
from tica.receipts import LEG_FILE, read_receipt
from tica.seal import SEAL_FILE
from tica.verdict import Verdict, VerdictCell

__all__ = ["JUDGE_VERSION", "JUDGES", "judge", "judge_criteria", "judge_recipe_identity", "expand_receipts", "cli_judge",
           "RecipeIdentityResult"]

Judge = Callable[[Question, Sequence[Path]], VerdictCell]

# Each item's judge, where the registry says it lives (its room, or tica/judges/<item>.py).
JUDGES: dict[EvidenceItem, Judge] = {r.item: r.judge_fn() for r in rooms()}

_ALIASES = {"exit": EvidenceItem.CLEAN_EXIT, "clean-exit": EvidenceItem.CLEAN_EXIT}


def as_item(item: EvidenceItem | str) -> EvidenceItem:
    if isinstance(item, EvidenceItem):
        return item
    return _ALIASES.get(item) or EvidenceItem(item)


def judge(item: EvidenceItem | str, question: Question, leg_paths: Sequence[str | Path],
          candidate: Candidate | None) -> VerdictCell:
    """The verdict cell of one evidence item for one candidate.

    The criteria's verdict stands only where every leg is bound to the candidate: a leg that
    records another candidate's identity, or nothing where the manifest pins a value, is not
    evidence for it, and neither is a judgement bound to no candidate at all (`candidate=None`).
    Such a cell is never `pass`; a `fail` or `not run` stays what it was, with the binding reasons
    beside it."""
    cell = judge_criteria(item, question, leg_paths)
    if candidate is None:
        problems: list[BindingProblem | str] = ["bound to no candidate: name the candidate's manifest to judge for it"]
    else:
        problems = bind_legs(leg_paths, candidate)
    disagree = ([f"the manifest's workload and the question disagree: {d}; no leg is evidence under both"
                 for d in workload_disagreements(candidate.manifest.workload, question.criteria)]
                if candidate is not None and isinstance(question.criteria, ThroughputCriteria) else [])
    cell = bound_cell(cell, candidate, problems)
    if disagree:
        # the question cannot be answered for this candidate as its manifest stands: that leads,
        # whatever the legs say; a pass becomes inconclusive, a fail or a not-run stays
        verdict = Verdict.INCONCLUSIVE if cell.verdict is Verdict.PASS else cell.verdict
        cell = cell.model_copy(update={
            "verdict": verdict, "reasons": (*(prefixed("inconclusive", d) for d in disagree), *cell.reasons),
            "summary": prefixed(verdict.value, f"{disagree[0]}; {without_prefix(cell.summary)}"),
            "numbers": {**cell.numbers, "workload_disagreements": disagree}})
    unchecked = unbound_pins(candidate, as_item(item)) if candidate is not None else []
    if not unchecked:
        return cell
    return cell.model_copy(update={"reasons": (*cell.reasons, *(prefixed("note", u) for u in unchecked)),
                                   "numbers": {**cell.numbers, "unbound_pins": unchecked}})


def bound_cell(cell: VerdictCell, candidate: Candidate | None, problems: Sequence[BindingProblem | str]) -> VerdictCell:
    binding = [{"reason": str(p), **({"leg": p.leg, "file": p.file, "component": p.component.value, "field": p.field,
                                      "pinned": p.pinned, "recorded": p.recorded, "kind": p.kind}
                                     if isinstance(p, BindingProblem) else {})} for p in problems]
    update: dict = {"candidate_id": candidate.candidate_id if candidate else None,
                    "numbers": {**cell.numbers, "binding": binding}}
    if problems:
        f = Findings()
        for p in problems:
            f.inconclusive(f"not evidence for this candidate: {_binding_text(p)}")
        # Unbound evidence never passes; a fail or a not-run stays what the criteria found.
        verdict = Verdict.INCONCLUSIVE if cell.verdict is Verdict.PASS else cell.verdict
        update.update(verdict=verdict, reasons=(*f.reasons(), *cell.reasons) if verdict is not cell.verdict
                      else (*cell.reasons, *f.reasons()),
                      summary=prefixed(verdict.value, (f"{len(problems)} binding problems, e.g. " if len(problems) > 1
                                                       else "not evidence for this candidate: ")
                                       + f"{_binding_text(problems[0])}; {criteria_alone(cell.summary)}")
                      if verdict is not cell.verdict else cell.summary)
    return cell.model_copy(update=update)


def _binding_value(value: object) -> str:
    text = json.dumps(value, sort_keys=True, default=str) if not isinstance(value, str) else value
    return clip(text, 120)


def _binding_text(p: BindingProblem | str) -> str:
    """A binding problem as a person reads it: the receipt's path relative, a long value cut at a
    word (with an ellipsis), never mid-word; a digest whole, so that two that differ show where."""
    if not isinstance(p, BindingProblem):
        return shown(str(p))
    if p.kind == "unrecorded":
        text = (f"{p.leg}: {p.component.value} not bound: the manifest pins {p.field} = {_binding_value(p.pinned)}; "
                f"{p.file} records nothing for it")
    else:
        text = (f"{p.leg}: {p.component.value} names another candidate: the manifest pins {p.field} = "
                f"{_binding_value(p.pinned)}; {p.file} records {_binding_value(p.recorded)}")
    return shown(text)


def judge_criteria(item: EvidenceItem | str, question: Question, leg_paths: Sequence[str | Path]) -> VerdictCell:
    """The verdict of the question's criteria alone, bound to no candidate (canaries and the
    criteria's own tests use it; acceptance uses `judge`). A receipt that cannot be read or
    whose seal does not verify is no evidence: the cell is `inconclusive`, naming the file and field."""
    item = as_item(item)
    paths = [Path(p) for p in leg_paths]
    try:
        result = JUDGES[item](question, paths)
    except ReceiptError as err:
        f = Findings()
        f.inconclusive(f"unreadable receipt: {err}")
        return cell(item, question, f, f"a receipt could not be read ({err.file}: {err.field})",
                    numbers={"receipt_error": {"file": err.file, "field": err.field, "message": err.message}})
    return _accounted(_pilots_are_no_formal_legs(_incomplete_legs_are_no_pass(result, paths), question), paths)


def _pilots_are_no_formal_legs(result: VerdictCell, question: Question) -> VerdictCell:
    """A frozen statistical basis names the sealed pilot legs it was planned from: a pilot sized the
    design and is never one of the formal measurements it decides (its digest among the judged)."""
    basis = getattr(question.criteria, "statistical_basis", None)
    if basis is None:
        return result
    pilots = {digests.canonical(d) for d in basis.pilot_digests}
    reused = sorted(Path(p).name for p, d in result.receipt_hashes.items() if d and digests.canonical(d) in pilots)
    if not reused:
        return result
    return without_pass(result, [f"{', '.join(reused)} {'is a pilot leg' if len(reused) == 1 else 'are pilot legs'} "
                                 "the statistical basis was planned from: a pilot is no formal measurement"])


def _accounted(result: VerdictCell, paths: Sequence[Path]) -> VerdictCell:
    """Every input named is judged (its receipt read: in receipt_hashes) or excluded with a reason
    that names it; `numbers["inputs"]` says which, per input. One neither judged nor named in a
    reason was dropped in silence: never a pass."""
    inputs, silent = [], []
    for p in paths:
        if str(p) in result.receipt_hashes:
            fate = "judged"
        else:
            why = next((r for r in result.reasons if p.name in r), None)
            fate = f"excluded: {why}" if why is not None else "dropped without a reason"
            if why is None:
                silent.append(p.name)
        inputs.append({"input": p.name, "fate": fate})
    result = result.model_copy(update={"numbers": {**result.numbers, "inputs": inputs}})
    return without_pass(result, [f"{', '.join(silent)} named as input(s) but neither judged nor refused"] if silent else [])


def _incomplete_legs_are_no_pass(result: VerdictCell, paths: Sequence[Path]) -> VerdictCell:
    """Rules every leg of every item obeys, whatever its judge reads: a leg whose producer recorded
    errors is incomplete, and a leg whose times contradict themselves (tica.leg_times) is no
    measurement. Either can keep a fail, never make a pass."""
    problems = []
    for p in paths:
        try:
            meta = read_receipt(p / LEG_FILE) if (p / LEG_FILE).is_file() else {}
        except (OSError, ValueError):
            continue
        if not isinstance(meta, dict):
            continue
        listed = meta.get("errors") or []
        problems += [f"{p.name}: producer error: {e}" for e in (listed if isinstance(listed, list) else [listed])]
        try:
            seal = read_receipt(p / SEAL_FILE)
        except (OSError, ValueError):
            seal = {}
        sealed_at = seal.get("sealed_at") if isinstance(seal, dict) else None
        problems += [f"{p.name}: {why}: the leg's times contradict themselves"
                     for why in leg_times.contradictions(meta, sealed_at)]
    return without_pass(result, problems)


def expand_receipts(paths: Sequence[str | Path]) -> list[Path]:
    """Leg directories and bare bench files named by `paths`: a directory holding leg.json is
    a leg; any other directory contributes its leg subdirectories and *.json files. Anything else
    in it (a folder without leg.json, an empty folder, a file of another kind) is refused by name,
    never skipped: an input the user named is judged or refused. Hidden entries (.name) are not
    receipts and are passed over."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir() and not (p / LEG_FILE).is_file():
            for c in sorted(p.iterdir()):
                if c.name.startswith("."):
                    continue
                if c.is_dir() and (c / LEG_FILE).is_file():
                    out.append(c)
                elif c.is_file() and c.suffix == ".json":
                    out.append(c)
                elif c.is_dir():
                    # a failing leg must never drop out of the set by losing its leg.json
                    raise ReceiptError(c, LEG_FILE, "a leg folder without leg.json: not a leg, and not skipped")
                else:
                    raise ReceiptError(c, "<file>", "neither a leg folder nor a bench JSON file: not skipped; "
                                       "move it out of the receipts folder")
        else:
            out.append(p)
    return out


_EXIT_CODES = {Verdict.PASS: 0, Verdict.FAIL: 1, Verdict.INCONCLUSIVE: 2, Verdict.NOT_RUN: 3}


def _print_human(summary: str, reasons: Sequence[str], tables: dict[str, str], out) -> None:
    print(summary, file=out)
    for r in reasons:
        print(f"  - {r}", file=out)
    for title, table in tables.items():
        print(f"\n## {title}\n\n{table}", file=out)


def load_candidate(manifest_path: str | Path) -> Candidate:
    from tica.candidate import identify
    from tica.manifest import load_manifest

    loaded = load_manifest(manifest_path)
    return Candidate.of(loaded, identify(loaded))


def cli_judge(argv: Sequence[str] | None = None, out=None) -> int:
    """`tica judge ITEM --question Q.yaml [--receipts DIR ...] [LEG ...] [--json]`;
    `tica judge recipe DRY_RUNS.json [--json]`. `--manifest M` binds the receipts to that
    candidate; without it no cell passes.

    Exit code: 0 pass, 1 fail, 2 inconclusive, 3 not run, 4 bad input. `--json` prints the
    VerdictCell's JSON (its pydantic schema is the stable, documented output) and nothing else.
    """
    out = out or sys.stdout
    parser = UsageParser(prog="tica judge", description="Judge sealed receipts under a frozen question.")
    parser.add_argument("item", help="|".join(n + (" (exit)" if n == EvidenceItem.CLEAN_EXIT.value else "")
                                              for n in item_names()) + "|recipe")
    parser.add_argument("legs", nargs="*", help="leg directories or bench JSON files (recipe: the dry-run receipt)")
    parser.add_argument("--question", "-q", help="frozen question YAML")
    parser.add_argument("--manifest", "-m", help="the candidate manifest the receipts must be bound to "
                        "(without it the cell is bound to no candidate and cannot pass)")
    parser.add_argument("--receipts", "-r", action="append", default=[], help="directory of legs (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the verdict cell as JSON only")
    args = parser.parse_intermixed_args(argv)
    try:
        if args.item == "recipe":
            paths = [*args.legs, *args.receipts]
            if len(paths) != 1:
                parser.error("recipe takes exactly one dry-run receipt")
            result = judge_recipe_identity(paths[0])
            if args.json:
                print(result.model_dump_json(indent=2), file=out)
            else:
                _print_human(result.summary, result.reasons, result.tables, out)
            return _EXIT_CODES[result.verdict]
        try:
            item = as_item(args.item)
        except ValueError:
            parser.error(f"unknown item {args.item!r}")
        if not args.question:
            parser.error("--question is required")
        question = load_question(args.question)
        candidate = load_candidate(args.manifest) if args.manifest else None
        verdict_cell = judge(item, question, expand_receipts([*args.receipts, *args.legs]), candidate)
        if "receipt_error" in verdict_cell.numbers:  # a malformed receipt is bad input here, not a verdict
            e = verdict_cell.numbers["receipt_error"]
            raise ReceiptError(e["file"], e["field"], e["message"])
    except InputError as err:
        print(json.dumps({"error": {"file": err.file, "field": err.field, "message": err.message}})
              if args.json else f"error: {err}", file=out)
        return 4
    if args.json:
        print(verdict_cell.model_dump_json(indent=2), file=out)
    else:
        _print_human(verdict_cell.summary, verdict_cell.reasons, verdict_cell.tables, out)
        print(f"\nquestion {verdict_cell.question_hash}, judge {verdict_cell.judge_version}", file=out)
    return _EXIT_CODES[verdict_cell.verdict]
