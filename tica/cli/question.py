"""`tica question freeze`: validate a question file and record it with its hash."""

from __future__ import annotations

import argparse
from typing import Any

from tica.cli._common import BAD, DONE, OTHER, Help, Verb, json_out, ledger_of
from tica.errors import EXIT_BAD_INPUT

HELP: dict[Verb, Help] = {
    ("question",): Help((DONE, BAD, OTHER), examples=("tica question freeze demo/questions/forward.yaml",)),
    ("question", "freeze"): Help((DONE, (EXIT_BAD_INPUT, "bad input: a malformed question, or one that changes a "
                                                         "question already frozen under its name"), OTHER),
                                 examples=("tica question freeze demo/questions/forward.yaml --json",)),
}


def add_parser(subparsers: Any) -> None:
    """Add `question freeze` to the `tica` subparsers object."""
    ques = subparsers.add_parser("question", help="frozen questions").add_subparsers(dest="sub", required=True)
    p = ques.add_parser("freeze", help="validate a question file and record it with its hash")
    p.add_argument("file")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_question_freeze)


def cmd_question_freeze(args: argparse.Namespace) -> int:
    from tica.records import freeze_question

    question = freeze_question(ledger_of(args), args.file)
    if json_out(args, {"name": question.name, "item": question.item.value, "question_hash": question.hash,
                       "formula": question.formula_label}):
        return 0
    print(f"{question.name}  {question.item.value}  {question.hash}")
    if question.formula_label:
        print(f"formula: {question.formula_label}")
    return 0
