"""`tica plan`: from a pilot's sealed legs to a question draft with a statistical basis.

    tica plan throughput PILOT_LEGS... --question Q.yaml --budget 32=0.10 [--budget 0.15] \\
        [--alpha 0.05] [--power 0.8] [--mdd 32=0.03] [--allow-unclean-exits] --out DRAFT.yaml [--json]
    tica plan quality PILOT_LEGS... --question Q.yaml [--threshold POINTS] [--alpha 0.05] \\
        [--power 0.8] [--mdd POINTS] [--problems-available M] --out DRAFT.yaml [--json]

Prints the plan (a table, or JSON with --json) and writes the draft for a person to review and
freeze. Exit code: 0 plan and draft written; 1 the pilot plans nothing (no draft written);
4 bad input, naming the file and the field. `tica.cli` wires `add_parser` and `run`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tica.cli._common import BAD, EXIT_NO, EXIT_OK, OTHER, Help, Verb
from tica.errors import EXIT_BAD_INPUT, InputError, QuestionError

if TYPE_CHECKING:
    from tica.question import Question, ThroughputCriteria

CLI = "<command line>"
NOTHING_PLANNED = 1

HELP: dict[Verb, Help] = {
    ("plan",): Help(((EXIT_OK, "plan and draft written"), (EXIT_NO, "the pilot plans nothing (no draft written)"),
                     BAD, OTHER), examples=("tica plan throughput --help", "tica plan quality --help")),
}
for _verb in ("throughput", "quality"):
    HELP[("plan", _verb)] = Help(HELP[("plan",)].codes, examples=(
        f"tica plan {_verb} PILOT_LEGS... -q demo/questions/{_verb}.yaml --out draft.yaml",))


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `plan` (with `throughput` and `quality`) to a `tica` subparsers object."""
    plan = subparsers.add_parser("plan", help="size a decidable question from a pilot: tica plan throughput|quality ...")
    sub = plan.add_subparsers(dest="sub", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("legs", nargs="+", help="pilot leg directories (or folders of legs, or bench JSON files)")
    common.add_argument("--question", "-q", required=True, help="the question YAML the pilot was run under")
    common.add_argument("--alpha", type=float, default=0.05, help="largest false-pass rate, in (0, 0.5) (default 0.05)")
    common.add_argument("--power", type=float, default=0.8, help="chance to pass at the planned difference (default 0.8)")
    common.add_argument("--out", required=True, help="where to write the question draft (YAML)")
    common.add_argument("--json", action="store_true", help="print the plan as JSON only")
    p = sub.add_parser("throughput", parents=[common], help="crossed rounds per concurrency for a budget")
    p.add_argument("--budget", action="append", default=[], metavar="C=B|B",
                   help="budget at concurrency C (repeatable); a bare B applies to every concurrency of the question; "
                        "default: the question's budgets")
    p.add_argument("--mdd", action="append", default=[], metavar="C=D|D",
                   help="minimum detectable difference under the budget (loss units); default: the pilot's distance "
                        "from its median loss to the budget")
    p.add_argument("--max-rounds", type=int, default=100,
                   help="the most crossed rounds worth running (default 100): a concurrency needing more is reported, "
                        "not planned")
    p.add_argument("--allow-unclean-exits", action="store_true",
                   help="count pilot rounds whose only problems are unclean exit receipts for the noise (named in "
                        "the plan and the draft; the judge never counts them)")
    p.set_defaults(func=run)
    p = sub.add_parser("quality", parents=[common], help="paired problems (and sampled repeats) for a threshold")
    p.add_argument("--threshold", type=float, help="max |score difference| in points (default: the question's)")
    p.add_argument("--mdd", type=float, help="minimum detectable difference inside the threshold, points "
                                             "(default: threshold - the pilot's |difference|)")
    p.add_argument("--problems-available", type=int, help="problems the dataset has (default: the pilot's count)")
    p.set_defaults(func=run)
    return plan


def build_parser() -> argparse.ArgumentParser:
    """A stand-alone `tica` parser holding only `plan` (tests, and `python -m tica.cli.plan`)."""
    from tica.errors import UsageParser

    parser = UsageParser(prog="tica", description=__doc__)
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def _per_c(values: list[str], concurrencies: tuple[int, ...], flag: str) -> dict[int, float]:
    """`C=X` and bare `X` (every concurrency) into {c: x}; a named C wins over a bare value."""
    bare: float | None = None
    named: dict[int, float] = {}
    for raw in values:
        try:
            if "=" in raw:
                c, x = raw.split("=", 1)
                named[int(c)] = float(x)
            else:
                bare = float(raw)
        except ValueError:
            raise InputError(CLI, flag, f"{raw!r} is not C=X or X (numbers)") from None
    out = {c: bare for c in concurrencies} if bare is not None else {}
    out.update(named)
    for c, x in out.items():
        if c not in concurrencies:
            raise InputError(CLI, flag, f"c={c} is not one of the question's concurrencies {list(concurrencies)}")
        if not math.isfinite(x):
            raise InputError(CLI, flag, f"c={c}: {x} is not a finite number")
    return out


def _check_rates(args: argparse.Namespace) -> None:
    if not 0 < args.alpha < 0.5:
        raise InputError(CLI, "--alpha", f"{args.alpha:g} is not in (0, 0.5)")
    if not 0 < args.power < 1:
        raise InputError(CLI, "--power", f"{args.power:g} is not in (0, 1)")


def _print_plan(headers: list[str], rows: list[list[Any]], notes: list[str], out) -> None:
    from tica.judging import md_table

    print(md_table(headers, rows), file=out)
    for note in notes:
        print(f"  - {note}", file=out)


def _write(draft: Question, item: str, path: str) -> None:
    from tica.stats.plan import draft_yaml

    try:
        Path(path).write_text(draft_yaml(draft, item))
    except OSError as err:
        raise InputError(path, "<file>", f"cannot write: {err.strerror}") from None


def _throughput(args: argparse.Namespace, question: Question, legs: list[Path], out) -> int:
    from tica.stats.plan import plan_throughput, read_pilot, throughput_draft

    from tica.question import ThroughputFormula

    criteria: ThroughputCriteria = question.criteria  # type: ignore[assignment]
    if criteria.formula is ThroughputFormula.RATIO_OF_MEDIAN_THROUGHPUTS:
        raise QuestionError(args.question, "criteria.formula", "TICA knows no exact test for the ratio of median "
                            "throughputs; a decidable budget needs median_per_round_paired_loss")
    budgets = _per_c(args.budget, criteria.concurrencies, "--budget") or dict(criteria.budget or {})
    if not budgets:
        raise InputError(CLI, "--budget", f"no budget given and {args.question} sets none")
    for c, b in budgets.items():
        if not 0 < b < 1:
            raise InputError(CLI, "--budget", f"c={c}: {b:g} is not a loss in (0, 1)")
    margins = _per_c(args.mdd, criteria.concurrencies, "--mdd")
    for c, m in margins.items():
        if not m > 0:
            raise InputError(CLI, "--mdd", f"c={c}: {m:g} is not a positive margin")
    pilot = read_pilot(question, legs, allow_unclean_exits=args.allow_unclean_exits)
    if args.max_rounds < 2:
        raise InputError(CLI, "--max-rounds", f"{args.max_rounds} is under 2")
    plan = plan_throughput(question, pilot, budgets, args.alpha, args.power, margins, args.max_rounds)
    draft = None
    if plan.rounds is not None:
        try:
            draft = throughput_draft(question, plan, budgets, args.out)
        except QuestionError as err:
            raise InputError(args.question, err.field, f"the draft would not be a valid question: {err.message}") from None
        _write(draft, "throughput", args.out)
    if args.json:
        print(json.dumps({"plan": plan.to_json(), "draft": args.out if draft else None,
                          "question_hash": draft.hash if draft else None}, indent=1), file=out)
    else:
        print(f"pilot: {pilot.legs} legs of {args.question}; sign test on the median per-round paired loss", file=out)
        _print_plan(*plan.table(), plan.notes, out)
        print(f"\ndraft ({plan.rounds} crossed rounds) written to {args.out}: review it, then freeze it"
              if draft else "\nno target concurrency could be planned: no draft written", file=out)
    return 0 if draft else NOTHING_PLANNED


def _quality(args: argparse.Namespace, question: Question, legs: list[Path], out) -> int:
    from tica.stats.plan import PilotError, plan_quality, quality_draft

    if args.threshold is not None and not (math.isfinite(args.threshold) and 0 < args.threshold <= 100):
        raise InputError(CLI, "--threshold", f"{args.threshold:g} is not in (0, 100] points")
    if args.mdd is not None and not (math.isfinite(args.mdd) and args.mdd > 0):
        raise InputError(CLI, "--mdd", f"{args.mdd:g} is not a positive number of points")
    if args.problems_available is not None and args.problems_available < 1:
        raise InputError(CLI, "--problems-available", f"{args.problems_available} is not a positive count")
    try:
        plan = plan_quality(question, legs, args.alpha, args.power, args.threshold, args.mdd, args.problems_available)
    except PilotError as err:
        raise InputError(", ".join(map(str, legs)), "<pilot>", str(err)) from None
    draft = None
    if plan.basis() is not None:
        try:
            draft = quality_draft(question, plan, args.out)
        except QuestionError as err:
            raise InputError(args.question, err.field, f"the draft would not be a valid question: {err.message}") from None
        _write(draft, "quality", args.out)
    if args.json:
        print(json.dumps({"plan": plan.to_json(), "draft": args.out if draft else None,
                          "question_hash": draft.hash if draft else None}, indent=1), file=out)
    else:
        print(f"pilot: {plan.n} paired problems of {args.question}; exact McNemar bounds on the discordant pairs",
              file=out)
        _print_plan(*plan.table(), plan.notes, out)
        print(f"\ndraft ({plan.problems} paired problems) written to {args.out}: review it, then freeze it"
              if draft else "\nthe number of problems could not be planned: no draft written", file=out)
    return 0 if draft else NOTHING_PLANNED


def run(args: argparse.Namespace, out=None) -> int:
    """Run `tica plan throughput|quality` from parsed arguments; the exit code."""
    from tica.judges import expand_receipts

    out = out or sys.stdout
    try:
        _check_rates(args)
        from tica.question import QualityCriteria, ThroughputCriteria, load_question

        question = load_question(args.question)
        want = ThroughputCriteria if args.sub == "throughput" else QualityCriteria
        if not isinstance(question.criteria, want):
            raise QuestionError(args.question, "item", f"is a {question.item.value} question, not {args.sub}")
        legs = expand_receipts(args.legs)
        return (_throughput if args.sub == "throughput" else _quality)(args, question, legs, out)
    except InputError as err:
        if getattr(args, "json", False):
            print(json.dumps({"error": {"file": err.file, "field": err.field, "message": err.message}}), file=out)
        else:
            print(f"tica: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
