"""`tica ledger`: query, verify, publish the head of, export and import the append-only ledger."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tica.cli._common import (BAD, DONE, EXIT_OTHER, OTHER, UNVERIFIED, Help, Verb, format_table, json_out,
                              ledger_of, printable)
from tica.errors import EXIT_BAD_INPUT, InputError

HEAD_MAX_BYTES = 64 * 1024  # a published head is one small JSON object


def _ledger_views() -> str:
    from tica.ledger import TABLES, VIEWS

    return ("views to query (read-only): " + ", ".join(VIEWS) + "\ntables: " + ", ".join(TABLES)
            + "\nfor example: tica ledger query \"SELECT item, verdict, stale, failed_checks FROM track_verdicts "
              "WHERE track = 'cpu-tiny'\"")


HELP: dict[Verb, Help] = {
    ("ledger",): Help((DONE, UNVERIFIED, BAD, OTHER), examples=("tica ledger verify", "tica ledger query --help")),
    ("ledger", "query"): Help((DONE, (EXIT_BAD_INPUT, "bad input: no ledger there, or a query refused (not "
                                                      "read-only, or not valid SQL)"), OTHER), examples=(
        "tica ledger query \"SELECT track, item, verdict, stale FROM track_verdicts\"",
        "tica ledger query \"SELECT * FROM stale_evidence\" --json"), more=_ledger_views),
    ("ledger", "verify"): Help((DONE, UNVERIFIED, BAD, OTHER), examples=(
        "tica ledger verify", "tica ledger verify --expect-head head.json --public-key head.pub")),
    ("ledger", "head"): Help((DONE, UNVERIFIED, BAD, OTHER),
                             examples=("tica ledger head --out head.json",
                                       "tica ledger head --out head.json --sign-key key.pem")),
    ("ledger", "export"): Help((DONE, UNVERIFIED, BAD, OTHER), examples=("tica ledger export --out chain.jsonl",)),
    ("ledger", "import"): Help((DONE, BAD, (EXIT_OTHER, "the imported chain does not verify to the export's head, "
                                                        "or another failure")),
                               examples=("tica --ledger new.duckdb ledger import chain.jsonl",)),
}


def add_parser(subparsers: Any) -> None:
    """Add `ledger` (query, verify, head, export, import) to the `tica` subparsers object."""
    led = subparsers.add_parser("ledger", help="the append-only ledger").add_subparsers(dest="sub", required=True)
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


def cmd_ledger_query(args: argparse.Namespace) -> int:
    import duckdb

    ledger = ledger_of(args).require_exists()
    from tica.ledger import PostgresLedger, QueryRefused

    refused: tuple[type[BaseException], ...] = (duckdb.Error, QueryRefused)
    if isinstance(ledger, PostgresLedger):  # the server refused it (privilege, timeout, two statements)
        import psycopg

        refused += (psycopg.Error,)
    try:
        columns, rows = ledger.query(args.sql, sandboxed=True)
    except refused as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"tica: query refused: {printable(first)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if json_out(args, {"columns": columns, "rows": [list(r) for r in rows]}):
        return 0
    print(format_table([printable(c) for c in columns], [[None if v is None else printable(v) for v in r] for r in rows]))
    return 0


def _read_head(path: str):
    from tica.errors import input_text
    from tica.ledger import Head

    # a regular file only (a FIFO named as a head would hang the command), and small
    return Head.from_json(input_text(path, max_bytes=HEAD_MAX_BYTES), path)


def cmd_ledger_verify(args: argparse.Namespace) -> int:
    if args.public_key and not args.expect_head:
        raise InputError("--public-key", "<usage>", "a public key checks a published head: give --expect-head too")
    expect = _read_head(args.expect_head) if args.expect_head else None
    problems: list[str] = []
    if args.public_key:
        from tica.head_signing import load_public_key, signature_problem

        problem = signature_problem(expect, load_public_key(args.public_key))
        problems += [problem] if problem else []
    report = ledger_of(args).require_exists().verify(expect)
    problems += report.problems
    if json_out(args, {"ok": not problems, "rows": report.rows, "head": json.loads(report.head.to_json()),
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
    report = ledger_of(args).require_exists().verify()
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
    """The verified chain as JSON Lines (tica.ledger.transfer); a chain that does not verify is refused."""
    from tica.ledger import export_chain

    ledger = ledger_of(args).require_exists()
    report = ledger.verify()
    if not report.ok:
        for problem in report.problems:
            print(f"FAIL {problem}", file=sys.stderr)
        return 1
    head = export_chain(ledger, args.out)
    if not json_out(args, {"out": args.out, "rows": head.seq, "head": json.loads(head.to_json())}):
        print(f"exported {head.seq} rows to {args.out}, head {head.row_hash}")
    return 0


def cmd_ledger_import(args: argparse.Namespace) -> int:
    """Rebuild an exported chain in an empty ledger, every hash preserved."""
    from tica.ledger import import_chain

    head = import_chain(ledger_of(args), args.file)
    if not json_out(args, {"file": args.file, "rows": head.seq, "head": json.loads(head.to_json())}):
        print(f"imported {head.seq} rows from {args.file}, head {head.row_hash} (verified)")
    return 0
