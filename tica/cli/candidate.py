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
    from tica import identity_cache

    # an unchanged candidate's answer, checked against every input it was read from (no pydantic, no YAML)
    answer = identity_cache.cached_answer(args.manifest)
    if answer is None:
        answer = _identify_and_keep(args.manifest)
    if json_out(args, answer):
        return 0
    print(f"track      {answer['track']}\ncandidate  {answer['candidate_id']}")
    for component, fp in answer["components"].items():
        print(f"  {component:<14} {fp}")
    return 0


def _identify_and_keep(manifest: str) -> dict[str, Any]:
    from pathlib import Path

    from tica import identity_cache
    from tica.candidate import identify
    from tica.errors import ManifestError, yaml_mapping_of
    from tica.manifest import load_manifest, named_file_texts
    from tica.source import WORKING_TREE

    loaded = load_manifest(manifest)
    # whether the source is the working tree, read from the bytes that were loaded (keep() refuses
    # an answer whose manifest changed since)
    source = yaml_mapping_of(Path(loaded.path).read_bytes(), loaded.path, ManifestError).get("source")
    working_tree = not isinstance(source, dict) or source.get("commit") == WORKING_TREE
    before = identity_cache.Inputs(loaded.path, None if loaded.checkpoint_path is None else str(loaded.checkpoint_path),
                                   None if loaded.checkpoint_root is None else str(loaded.checkpoint_root),
                                   named_file_texts(loaded.manifest), working_tree)
    ident = identify(loaded)
    answer = {"track": ident.track, "candidate_id": ident.candidate_id,
              "components": {c.value: fp for c, fp in ident.components.items()}}
    # the working tree's commit as git gave it to the answer (None: no checkout, the manifest keeps
    # "working-tree"); git reads it again on the next run
    resolved = loaded.manifest.source.commit
    commit = resolved if working_tree and resolved != WORKING_TREE else None
    identity_cache.keep(before, loaded.text_hash.removeprefix("sha256:"),
                        {c.value: files for c, files in loaded.named_files.items()}, commit, answer)
    return answer


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
