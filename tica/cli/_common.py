"""What every `tica` verb shares: exit codes, the ledger option, --json, tables and help epilogs.

Light on purpose: `tica --help` imports this and every verb module, never DuckDB, pydantic or
torch (benchmarks/cli_startup.py); each handler imports what it uses.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tica.errors import EXIT_BAD_INPUT, UsageParser

if TYPE_CHECKING:
    from tica.ledger import LedgerStore

EXIT_OK = 0
EXIT_NO = 1  # the answer was given, and it is no: not accepted, a chain that does not verify
EXIT_OTHER = 5  # neither an answer nor bad input: a lock held too long, a ledger that does not verify
CLI = "<command line>"

Verb = tuple[str, ...]  # the words that reach a parser: () for `tica`, ("ledger", "query"), ...


def format_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[("" if v is None else str(v)) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    out = [line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells]
    return "\n".join(out) + f"\n({len(cells)} row{'s' if len(cells) != 1 else ''})"


def ledger_of(args: argparse.Namespace) -> "LedgerStore":
    """The ledger --ledger (or TICA_LEDGER) names: a DuckDB file, or a postgresql:// address."""
    from tica.ledger import default_ledger_path, open_ledger

    return open_ledger(str(args.ledger or default_ledger_path()))


def json_out(args: argparse.Namespace, data: object) -> bool:
    """With --json, print `data` as the verb's only output (True); else print nothing (False)."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=1, default=str))
        return True
    return False


def printable(value: object) -> str:
    """One line, control bytes escaped: what SQL returns is data, never terminal control."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))


# ---------------------------------------------------------------------------- help


@dataclass(frozen=True)
class Help:
    """What a verb's --help ends with: its exit codes, examples, and anything else worth knowing."""

    codes: tuple[tuple[int, str], ...]
    examples: tuple[str, ...] = ()
    more: Callable[[], str] | None = None  # computed only when the help is shown (e.g. needs DuckDB's module)

    def text(self) -> str:
        import textwrap

        lines = ["exit codes:", *(textwrap.fill(f"  {code}  {what}", 100, subsequent_indent="     ")
                                  for code, what in self.codes)]
        if self.examples:
            lines += ["", "examples:", *(f"  {e}" for e in self.examples)]
        if self.more is not None:
            lines += ["", self.more()]
        return "\n".join(lines)


DONE = (EXIT_OK, "done")
BAD = (EXIT_BAD_INPUT, "bad input: the file (or option) and the field are named; nothing was changed")
OTHER = (EXIT_OTHER, "another failure, named on stderr, that is neither an answer nor bad input (a ledger lock "
                     "held too long, say)")
UNVERIFIED = (EXIT_NO, "the chain does not verify: every problem is printed (FAIL ...) on stderr")
M = "demo/candidates/cpu-tiny.yaml"


class HelpParser(UsageParser):
    """A parser whose epilog may be computed when its help is shown (a callable), so `tica --help`
    imports nothing heavy."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


def _children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def walk(parser: argparse.ArgumentParser, path: Verb = ()) -> Iterator[tuple[Verb, argparse.ArgumentParser]]:
    """Every parser under `parser` (itself first), with the words that reach it."""
    yield path, parser
    for name, child in _children(parser).items():
        yield from walk(child, (*path, name))
