"""The `tica` command: candidates, questions, the ledger and judging, from a shell."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from functools import cache
from types import ModuleType

from tica.cli._common import BAD, EXIT_NO, EXIT_OK, EXIT_OTHER, Help, HelpParser, M, Verb, walk
from tica.errors import EXIT_BAD_INPUT, InputError, TicaError

__all__ = ["EXIT_BAD_INPUT", "EXIT_NO", "EXIT_OK", "EXIT_OTHER", "HELP", "build_parser", "main", "walk"]

# One module per verb, in the order `tica --help` lists them; each registers its parser and imports
# what its handler uses, so `tica --help` and a usage error pay for neither DuckDB nor pydantic nor
# torch (benchmarks/cli_startup.py). They are imported when the parser is built, not with this
# package, so `python -m tica.cli.schema` (each keeps a stand-alone main) runs its module once.
VERBS = ("judge", "candidate", "question", "ledger", "report", "leg", "ingest", "plan", "schema")

ROOT_HELP = Help((
    (EXIT_OK, "done; for `tica report`: every track named is accepted; for `tica judge`: the cell passes"),
    (EXIT_NO, "the answer is no: a track not accepted, a cell that fails, a chain that does not verify, a leg "
              "that did not end cleanly, a pilot that plans nothing"),
    (2, "tica judge: the cell is inconclusive"),
    (3, "tica judge: the cell is not run"),
    BAD, (EXIT_OTHER, "another failure, named on stderr, that is neither an answer nor bad input: a ledger "
                      "whose chain does not verify for `tica report`, a lock held too long")), examples=(
    f"tica --ledger data/ledger.duckdb report cpu-tiny --manifest {M} --html report.html",
    f"tica judge forward -q demo/questions/forward.yaml -m {M} -r LEGS_DIR",
    "tica ledger query \"SELECT * FROM track_verdicts\"",
    "tica <verb> --help   (each verb lists its own exit codes)"))


def verb_modules() -> list[ModuleType]:
    return [importlib.import_module(f"tica.cli.{name}") for name in VERBS]


@cache
def help_table() -> dict[Verb, Help]:
    """What each parser's --help ends with, by the words that reach it: `tica`'s own, then each verb's."""
    table = {(): ROOT_HELP}
    for module in verb_modules():
        table.update(module.HELP)
    return table


def __getattr__(name: str) -> object:
    if name == "HELP":  # the table, read as a constant (tests)
        return help_table()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _add_help(parser: argparse.ArgumentParser) -> None:
    """Each verb's epilog (HELP), and raw formatting so its lines stay lines."""
    from tica.cli.judge import judge_help_text

    table = help_table()
    for path, p in walk(parser):
        entry = table.get(path)
        if entry is None:
            continue
        if p.formatter_class is argparse.HelpFormatter:
            p.formatter_class = argparse.RawDescriptionHelpFormatter
        p.epilog = judge_help_text if path == ("judge",) else entry.text


def build_parser() -> argparse.ArgumentParser:
    parser = HelpParser(prog="tica", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ledger", help="DuckDB ledger file or postgresql:// address (default: $TICA_LEDGER or "
                                         "data/ledger.duckdb)")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in verb_modules():
        module.add_parser(sub)  # `ingest` joins the `tica leg` that `leg` made
    _add_help(parser)
    return parser


def _ledger_missing(err: TicaError) -> bool:
    """A missing ledger is bad input. Only a verb that opened the ledger can raise it, so a verb that
    never imported the ledger (fingerprint, judge) does not pay for importing it here."""
    interface = sys.modules.get("tica.ledger.interface")
    return interface is not None and isinstance(err, interface.LedgerMissing)


def main(argv: Sequence[str] | None = None) -> int:
    from tica.cli import judge

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["judge"]:
        return judge.run(argv[1:])
    if judge.misplaced(argv):
        return judge.refuse_misplaced()
    args = build_parser().parse_args(argv)
    from tica.errors import FrozenQuestionError

    try:
        return args.func(args)
    except (FrozenQuestionError, InputError) as err:
        print(f"tica: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except TicaError as err:  # a lock held too long, an unreadable ledger: not a verdict, not bad input
        print(f"tica: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT if _ledger_missing(err) else EXIT_OTHER
