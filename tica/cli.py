"""The `tica` command: candidates, questions, the ledger and judging, from a shell."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from pathlib import Path
from typing import TYPE_CHECKING

from tica.errors import EXIT_BAD_INPUT, InputError, TicaError, UsageParser

if TYPE_CHECKING:
    from tica.ledger import Ledger

# Each verb imports what it uses: `tica --help` and a usage error must not pay for DuckDB,
# pydantic and torch (benchmarks/cli_startup.py).


def format_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[("" if v is None else str(v)) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    out = [line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells]
    return "\n".join(out) + f"\n({len(cells)} row{'s' if len(cells) != 1 else ''})"


def _ledger(args: argparse.Namespace) -> "Ledger":
    """The ledger --ledger (or TICA_LEDGER) names: a DuckDB file, or a postgresql:// address."""
    from tica.ledger import default_ledger_path
    from tica.ledger_pg import open_ledger

    return open_ledger(str(args.ledger or default_ledger_path()))  # type: ignore[return-value]


def _json_out(args: argparse.Namespace, data: object) -> bool:
    """With --json, print `data` as the verb's only output (True); else print nothing (False)."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=1, default=str))
        return True
    return False


def cmd_candidate_fingerprint(args: argparse.Namespace) -> int:
    from tica.candidate import identify_file

    ident = identify_file(args.manifest)
    if _json_out(args, {"track": ident.track, "candidate_id": ident.candidate_id,
                        "components": {c.value: fp for c, fp in ident.components.items()}}):
        return 0
    print(f"track      {ident.track}\ncandidate  {ident.candidate_id}")
    for component, fp in ident.components.items():
        print(f"  {component.value:<14} {fp}")
    return 0


def cmd_candidate_diff(args: argparse.Namespace) -> int:
    from tica.candidate import diff, identify_file, voided_items

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
    from tica.candidate import identify
    from tica.manifest import load_manifest
    from tica.records import record_candidate

    loaded = load_manifest(args.manifest)
    cid = record_candidate(_ledger(args), identify(loaded), loaded)
    if not _json_out(args, {"candidate_id": cid}):
        print(cid)
    return 0


def cmd_question_freeze(args: argparse.Namespace) -> int:
    from tica.records import freeze_question

    question = freeze_question(_ledger(args), args.file)
    if _json_out(args, {"name": question.name, "item": question.item.value, "question_hash": question.hash,
                        "formula": question.formula_label}):
        return 0
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
    if _json_out(args, {"columns": columns, "rows": [list(r) for r in rows]}):
        return 0
    print(format_table([_printable(c) for c in columns], [[None if v is None else _printable(v) for v in r] for r in rows]))
    return 0


def _read_head(path: str):
    from tica.ledger import Head

    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(path, "<file>", f"cannot read: {getattr(err, 'strerror', None) or err}") from None
    return Head.from_json(text, path)


def cmd_ledger_verify(args: argparse.Namespace) -> int:
    if args.public_key and not args.expect_head:
        raise InputError("--public-key", "<usage>", "a public key checks a published head: give --expect-head too")
    expect = _read_head(args.expect_head) if args.expect_head else None
    problems: list[str] = []
    if args.public_key:
        from tica.head_signing import load_public_key, signature_problem

        problem = signature_problem(expect, load_public_key(args.public_key))
        problems += [problem] if problem else []
    report = _ledger(args).require_exists().verify(expect)
    problems += report.problems
    if _json_out(args, {"ok": not problems, "rows": report.rows, "head": json.loads(report.head.to_json()),
                        "expected_head": json.loads(expect.to_json()) if expect else None,
                        "signature_checked": bool(args.public_key), "problems": problems}):
        return 0 if not problems else 1
    if not problems:
        held = ""
        if expect:
            held = f" (holds the published head seq={expect.seq}" + (
                f", signed by {expect.signed_by})" if args.public_key else
                ("; its signature was not checked: give --public-key)" if expect.signature else ")"))
        print(f"ok: {report.rows} rows, head {report.head_hash}{held}")
        return 0
    for problem in problems:
        print(f"FAIL {problem}", file=sys.stderr)
    return 1


def cmd_ledger_head(args: argparse.Namespace) -> int:
    """Publish the head (seq, hash, time) of a chain that verifies, to anchor its tail."""
    key = None
    if args.sign_key:
        from tica.head_signing import load_private_key

        key = load_private_key(args.sign_key)
    report = _ledger(args).require_exists().verify()
    if not report.ok:
        for problem in report.problems:
            print(f"FAIL {problem}", file=sys.stderr)
        return 1
    head = report.head
    if key is not None:
        from tica.head_signing import sign

        head = sign(head, key)
    text = head.to_json()
    if args.json:
        if args.out:
            Path(args.out).write_text(text + "\n")
        print(text)
        return 0
    if args.out:
        Path(args.out).write_text(text + "\n")
        signed = f", signed by {head.signed_by}" if head.signed_by else ""
        print(f"head seq={head.seq} {head.row_hash} written to {args.out}{signed}")
    else:
        print(text)
    return 0


def cmd_ledger_export(args: argparse.Namespace) -> int:
    """The verified chain as JSON Lines (tica.ledger_transfer); a chain that does not verify is refused."""
    from tica.ledger_transfer import export_chain

    ledger = _ledger(args).require_exists()
    report = ledger.verify()
    if not report.ok:
        for problem in report.problems:
            print(f"FAIL {problem}", file=sys.stderr)
        return 1
    head = export_chain(ledger, args.out)
    if not _json_out(args, {"out": args.out, "rows": head.seq, "head": json.loads(head.to_json())}):
        print(f"exported {head.seq} rows to {args.out}, head {head.row_hash}")
    return 0


def cmd_ledger_import(args: argparse.Namespace) -> int:
    """Rebuild an exported chain in an empty ledger, every hash preserved."""
    from tica.ledger_transfer import import_chain

    head = import_chain(_ledger(args), args.file)
    if not _json_out(args, {"file": args.file, "rows": head.seq, "head": json.loads(head.to_json())}):
        print(f"imported {head.seq} rows from {args.file}, head {head.row_hash} (verified)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = UsageParser(prog="tica", description=__doc__)
    parser.add_argument("--ledger", help="DuckDB ledger file or postgresql:// address (default: $TICA_LEDGER or "
                                         "data/ledger.duckdb)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("judge", help="judge sealed receipts under a frozen question: tica judge ITEM -q Q.yaml LEG...")

    cand = sub.add_parser("candidate", help="candidate manifests").add_subparsers(dest="sub", required=True)
    p = cand.add_parser("fingerprint", help="fingerprint every component of a manifest")
    p.add_argument("manifest")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_candidate_fingerprint)
    p = cand.add_parser("diff", help="which components changed and which evidence each change invalidates")
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_candidate_diff)
    p = cand.add_parser("record", help="record a candidate and its fingerprints in the ledger")
    p.add_argument("manifest")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_candidate_record)

    ques = sub.add_parser("question", help="frozen questions").add_subparsers(dest="sub", required=True)
    p = ques.add_parser("freeze", help="validate a question file and record it with its hash")
    p.add_argument("file")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_question_freeze)

    led = sub.add_parser("ledger", help="the append-only ledger").add_subparsers(dest="sub", required=True)
    p = led.add_parser("query", help="run read-only SQL and print a table")
    p.add_argument("sql")
    p.add_argument("--json", action="store_true", help="columns and rows as JSON")
    p.set_defaults(func=cmd_ledger_query)
    p = led.add_parser("verify", help="recompute the hash chain and the views; name any edited row")
    p.add_argument("--expect-head", help="a head published by `tica ledger head`: fail if the chain no longer holds it")
    p.add_argument("--json", action="store_true")
    p.add_argument("--public-key", help="Ed25519 public key (PEM): the published head must carry a valid signature by it")
    p.set_defaults(func=cmd_ledger_verify)
    p = led.add_parser("head", help="print (or --out FILE) the verified chain's head: seq, hash, time")
    p.add_argument("--out", help="write the head as JSON to this file")
    p.add_argument("--json", action="store_true", help="print the head JSON (also with --out)")
    p.add_argument("--sign-key", help="Ed25519 private key (PEM, e.g. from `openssl genpkey -algorithm ed25519`): sign the head")
    p.set_defaults(func=cmd_ledger_head)

    p = led.add_parser("export", help="write the verified chain as JSON Lines, every hash kept (to import elsewhere)")
    p.add_argument("--out", required=True, help="the export file (JSON Lines)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ledger_export)
    p = led.add_parser("import", help="rebuild an exported chain in an empty ledger (--ledger), every hash checked")
    p.add_argument("file", help="a file written by `tica ledger export`")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ledger_import)

    from tica import ingest_cli, leg_run_cli, plan_cli, schema_cli

    leg_run_cli.add_parser(sub)
    ingest_cli.add_parser(sub)  # joins `tica leg`
    plan_cli.add_parser(sub)
    schema_cli.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["judge"]:
        # judging owns its arguments and exit codes (0 pass, 1 fail, 2 inconclusive, 3 not run, 4 bad input)
        from tica.judges import cli_judge

        return cli_judge(argv[1:])
    args = build_parser().parse_args(argv)
    from tica.errors import FrozenQuestionError
    from tica.ledger import LedgerMissing

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
