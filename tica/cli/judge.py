"""`tica judge`: the judges' own command line (`tica.judges.cli_judge`) and its exit codes.

Judging owns its arguments and exit codes (0 pass, 1 fail, 2 inconclusive, 3 not run, 4 bad
input), so `tica` hands it the words after `judge` unparsed; the placeholder parser here only
lists it in `tica --help`.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Sequence
from typing import Any

from tica.cli._common import EXIT_OK, M, Help, Verb
from tica.errors import EXIT_BAD_INPUT

HELP: dict[Verb, Help] = {
    ("judge",): Help((), examples=(
        f"tica judge forward -q demo/questions/forward.yaml -m {M} -r LEGS_DIR",
        "tica judge throughput -q demo/questions/throughput.yaml -m M.yaml LEG1 LEG2 --json")),
}


def add_parser(subparsers: Any) -> None:
    """Add the `judge` placeholder to the `tica` subparsers object (`tica judge` never parses through it)."""
    subparsers.add_parser("judge", help="judge sealed receipts under a frozen question: tica judge ITEM -q Q.yaml LEG...")


def _judge_codes() -> tuple[tuple[int, str], ...]:
    from tica.judges import _EXIT_CODES

    verdicts = sorted(_EXIT_CODES.items(), key=lambda kv: kv[1])
    return (*((code, f"the cell is {verdict.value}") for verdict, code in verdicts),
            (EXIT_BAD_INPUT, "bad input: a malformed question, manifest or receipt (a receipt whose seal does not "
                             "match included), named with its field"))


def judge_help_text() -> str:
    """`tica judge`'s exit codes, read from the judges' own table, and its examples."""
    return Help(_judge_codes(), HELP[("judge",)].examples).text()


def _asks_help(argv: Sequence[str]) -> bool:
    words = list(argv[: list(argv).index("--")] if "--" in argv else argv)
    return "-h" in words or "--help" in words


def misplaced(argv: Sequence[str]) -> bool:
    """Whether `judge` comes after global options only (`tica --ledger L judge ...`): refused by name."""
    argv = list(argv)
    return "judge" in argv[1:] and all(a.startswith("-") or argv[i - 1] == "--ledger" for i, a in
                                       enumerate(argv[: argv.index("judge")]))


def refuse_misplaced() -> int:
    print("tica: error: tica judge reads receipts and writes no ledger: give its options after `judge`, "
          "without --ledger", file=sys.stderr)
    return EXIT_BAD_INPUT


def run(argv: list[str]) -> int:
    """`tica judge`: the judges' own CLI and exit codes; its --help ends with them listed."""
    from tica.judges import cli_judge

    if not _asks_help(argv):
        return cli_judge(argv)
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        try:
            code = cli_judge(argv)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else EXIT_OK
    print(shown.getvalue().rstrip("\n") + "\n\n" + judge_help_text())
    return code
