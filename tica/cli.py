"""The `tica` command: candidates, questions, the ledger and judging, from a shell."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from tica.candidate import diff, identify, identify_file, voided_items
from pathlib import Path

from tica.errors import EXIT_BAD_INPUT, FrozenQuestionError, InputError, TicaError, UsageParser
from tica.ledger import Ledger, LedgerMissing, default_ledger_path
from tica.manifest import load_manifest
from tica.records import freeze_question, record_candidate


def format_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[("" if v is None else str(v)) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    out = [line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells]
    return "\n".join(out) + f"\n({len(cells)} row{'s' if len(cells) != 1 else ''})"


def _ledger(args: argparse.Namespace) -> Ledger:
    return Ledger(args.ledger or default_ledger_path())


def cmd_candidate_fingerprint(args: argparse.Namespace) -> int:
    ident = identify_file(args.manifest)
    print(f"track      {ident.track}\ncandidate  {ident.candidate_id}")
    for component, fp in ident.components.items():
        print(f"  {component.value:<14} {fp}")
    return 0


def cmd_candidate_diff(args: argparse.Namespace) -> int:
    old, new = identify_file(args.old), identify_file(args.new)
    changes = diff(old, new)
    if args.json:
        print(json.dumps([c.model_dump(mode="json") for c in changes], indent=1))
        return 0
    print(f"{old.candidate_id} -> {new.candidate_id}")
    if not changes:
        print("no component changed: all evidence stands")
        return 0
    rows = [(c.component.value, c.old[:23], c.new[:23], ", ".join(i.value for i in c.invalidates), c.why) for c in changes]
    print(format_table(["component", "old", "new", "invalidates", "why"], rows))
    voided = voided_items(changes)
    print("voided evidence: " + ", ".join(f"{i.value} (by {', '.join(c.value for c in cs)})" for i, cs in voided.items()))
    return 0


def cmd_candidate_record(args: argparse.Namespace) -> int:
    loaded = load_manifest(args.manifest)
    cid = record_candidate(_ledger(args), identify(loaded), loaded)
    print(cid)
    return 0


def cmd_question_freeze(args: argparse.Namespace) -> int:
    question = freeze_question(_ledger(args), args.file)
    print(f"{question.name}  {question.item.value}  {question.hash}")
    if question.formula_label:
        print(f"formula: {question.formula_label}")
    return 0


def _printable(value: object) -> str:
    """One line, control bytes escaped: what SQL returns is data, never terminal control."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))


def cmd_ledger_query(args: argparse.Namespace) -> int:
    import duckdb

    ledger = _ledger(args).require_exists()
    try:
        columns, rows = ledger.query(args.sql, sandboxed=True)
    except duckdb.Error as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"tica: query refused: {_printable(first)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(format_table([_printable(c) for c in columns], [[None if v is None else _printable(v) for v in r] for r in rows]))
    return 0


def cmd_ledger_verify(args: argparse.Namespace) -> int:
    from tica.ledger import Head

    expect = None
    if args.expect_head:
        try:
            text = Path(args.expect_head).read_text()
        except OSError as err:
            raise InputError(args.expect_head, "<file>", f"cannot read: {err.strerror}") from None
        expect = Head.from_json(text, args.expect_head)
    report = _ledger(args).require_exists().verify(expect)
    if report.ok:
        print(f"ok: {report.rows} rows, head {report.head_hash}" + (f" (holds the published head seq={expect.seq})"
                                                                     if expect else ""))
        return 0
    for problem in report.problems:
        print(f"FAIL {problem}", file=sys.stderr)
    return 1


def cmd_ledger_head(args: argparse.Namespace) -> int:
    """Publish the head (seq, hash, time) of a chain that verifies, to anchor its tail."""
    report = _ledger(args).require_exists().verify()
    if not report.ok:
        for problem in report.problems:
            print(f"FAIL {problem}", file=sys.stderr)
        return 1
    text = report.head.to_json()
    if args.out:
        Path(args.out).write_text(text + "\n")
        print(f"head seq={report.head.seq} {report.head.row_hash} written to {args.out}")
    else:
        print(text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = UsageParser(prog="tica", description=__doc__)
    parser.add_argument("--ledger", help="DuckDB ledger file (default: $TICA_LEDGER or data/ledger.duckdb)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("judge", help="judge sealed receipts under a frozen question: tica judge ITEM -q Q.yaml LEG...")

    cand = sub.add_parser("candidate", help="candidate manifests").add_subparsers(dest="sub", required=True)
    p = cand.add_parser("fingerprint", help="fingerprint every component of a manifest")
    p.add_argument("manifest")
    p.set_defaults(func=cmd_candidate_fingerprint)
    p = cand.add_parser("diff", help="which components changed and which evidence each change invalidates")
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_candidate_diff)
    p = cand.add_parser("record", help="record a candidate and its fingerprints in the ledger")
    p.add_argument("manifest")
    p.set_defaults(func=cmd_candidate_record)

    ques = sub.add_parser("question", help="frozen questions").add_subparsers(dest="sub", required=True)
    p = ques.add_parser("freeze", help="validate a question file and record it with its hash")
    p.add_argument("file")
    p.set_defaults(func=cmd_question_freeze)

    led = sub.add_parser("ledger", help="the append-only ledger").add_subparsers(dest="sub", required=True)
    p = led.add_parser("query", help="run read-only SQL and print a table")
    p.add_argument("sql")
    p.set_defaults(func=cmd_ledger_query)
    p = led.add_parser("verify", help="recompute the hash chain and the views; name any edited row")
    p.add_argument("--expect-head", help="a head published by `tica ledger head`: fail if the chain no longer holds it")
    p.set_defaults(func=cmd_ledger_verify)
    p = led.add_parser("head", help="print (or --out FILE) the verified chain's head: seq, hash, time")
    p.add_argument("--out", help="write the head as JSON to this file")
    p.set_defaults(func=cmd_ledger_head)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["judge"]:
        # judging owns its arguments and exit codes (0 pass, 1 fail, 2 inconclusive, 3 not run, 4 bad input)
        from tica.judges import cli_judge

        return cli_judge(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except FrozenQuestionError as err:
        print(f"tica: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (InputError, LedgerMissing) as err:
        print(f"tica: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except TicaError as err:  # a lock held too long, an unreadable ledger: not a verdict, not bad input
        print(f"tica: error: {err}", file=sys.stderr)
        return 5


if __name__ == "__main__":
    raise SystemExit(main())
