"""`tica candidate`: fingerprint a manifest, diff two, record one in the ledger."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tica.cli._common import BAD, DONE, OTHER, Help, M, Verb, format_table, json_out, ledger_of

HELP: dict[Verb, Help] = {
    ("candidate",): Help((DONE, BAD, OTHER), examples=(f"tica candidate fingerprint {M}",)),
    ("candidate", "fingerprint"): Help((DONE, BAD), examples=(f"tica candidate fingerprint {M} --json",)),
    ("candidate", "diff"): Help((DONE, BAD), examples=("tica candidate diff old.yaml new.yaml",)),
    ("candidate", "record"): Help((DONE, BAD, OTHER),
                                  examples=(f"tica --ledger data/ledger.duckdb candidate record {M}",)),
}


def add_parser(subparsers: Any) -> None:
    """Add `candidate` (fingerprint, diff, record) to the `tica` subparsers object."""
    cand = subparsers.add_parser("candidate", help="candidate manifests").add_subparsers(dest="sub", required=True)
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


def cmd_candidate_fingerprint(args: argparse.Namespace) -> int:
    from tica.candidate import identify_file

    ident = identify_file(args.manifest)
    if json_out(args, {"track": ident.track, "candidate_id": ident.candidate_id,
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
    cid = record_candidate(ledger_of(args), identify(loaded), loaded)
    if not json_out(args, {"candidate_id": cid}):
        print(cid)
    return 0
