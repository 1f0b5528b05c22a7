"""The `tica` command: candidates, questions, the ledger and judging, from a shell."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tica.errors import EXIT_BAD_INPUT, InputError, TicaError, UsageParser

if TYPE_CHECKING:
    from tica.acceptance import Report
    from tica.candidate import CandidateIdentity
    from tica.evidence import EvidenceItem
    from tica.ledger import LedgerStore

EXIT_OK = 0
EXIT_NO = 1  # the answer was given, and it is no: not accepted, a chain that does not verify
EXIT_OTHER = 5  # neither an answer nor bad input: a lock held too long, a ledger that does not verify
CLI = "<command line>"

# Each verb imports what it uses: `tica --help` and a usage error must not pay for DuckDB,
# pydantic and torch (benchmarks/cli_startup.py).


def format_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[("" if v is None else str(v)) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()  # noqa: E731
    out = [line(columns), line(["-" * w for w in widths])] + [line(r) for r in cells]
    return "\n".join(out) + f"\n({len(cells)} row{'s' if len(cells) != 1 else ''})"


def _ledger(args: argparse.Namespace) -> "LedgerStore":
    """The ledger --ledger (or TICA_LEDGER) names: a DuckDB file, or a postgresql:// address."""
    from tica.ledger import default_ledger_path, open_ledger

    return open_ledger(str(args.ledger or default_ledger_path()))


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
    from tica.ledger import PostgresLedger, QueryRefused

    refused: tuple[type[BaseException], ...] = (duckdb.Error, QueryRefused)
    if isinstance(ledger, PostgresLedger):  # the server refused it (privilege, timeout, two statements)
        import psycopg

        refused += (psycopg.Error,)
    try:
        columns, rows = ledger.query(args.sql, sandboxed=True)
    except refused as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"tica: query refused: {_printable(first)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if _json_out(args, {"columns": columns, "rows": [list(r) for r in rows]}):
        return 0
    print(format_table([_printable(c) for c in columns], [[None if v is None else _printable(v) for v in r] for r in rows]))
    return 0


HEAD_MAX_BYTES = 64 * 1024  # a published head is one small JSON object


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
    """The verified chain as JSON Lines (tica.ledger.transfer); a chain that does not verify is refused."""
    from tica.ledger import export_chain

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
    from tica.ledger import import_chain

    head = import_chain(_ledger(args), args.file)
    if not _json_out(args, {"file": args.file, "rows": head.seq, "head": json.loads(head.to_json())}):
        print(f"imported {head.seq} rows from {args.file}, head {head.row_hash} (verified)")
    return 0


# ---------------------------------------------------------------------------- tica report

QUESTION_SUFFIXES = (".yaml", ".yml")  # as tica_assets.core.find_question reads a questions folder
TRACK_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"  # as a manifest's `track:` (tica.manifest.Manifest)


def _report_args(args: argparse.Namespace):
    """The report's arguments, validated (pydantic): a track name a manifest could carry, a
    questions folder ($TICA_QUESTIONS_DIR, else demo/questions), manifests and the page path."""
    from typing import Annotated

    from pydantic import BaseModel, ConfigDict, Field, ValidationError

    from tica.errors import pydantic_errors

    class ReportArgs(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)

        tracks: list[Annotated[str, Field(pattern=TRACK_PATTERN)]] = Field(min_length=1)
        manifests: list[Path] = []
        questions: Path
        html: Path | None = None

    try:
        return ReportArgs(tracks=list(dict.fromkeys(args.tracks)), manifests=args.manifest or [],
                          questions=args.questions or os.environ.get("TICA_QUESTIONS_DIR") or "demo/questions",
                          html=args.html)
    except ValidationError as err:
        raise pydantic_errors(InputError, CLI, err) from None


def _question_hashes(folder: Path) -> dict["EvidenceItem", list[tuple[str, str]]]:
    """Per item, (file name, hash) of each question file directly in `folder` (none: no folder).
    A file that cannot be read as a question is bad input (QuestionError names it and the field)."""
    from tica.question import load_question

    found: dict[EvidenceItem, list[tuple[str, str]]] = {}
    if not folder.is_dir():
        return found
    for path in sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in QUESTION_SUFFIXES):
        question = load_question(path)
        found.setdefault(question.item, []).append((path.name, question.hash))
    return found


def questions_in_force(questions_dir: Path, track: str) -> dict["EvidenceItem", str | None]:
    """Per item, the hash of the question the track asks now, found as the Dagster layer finds it
    (`tica_assets.core.find_question`: `<dir>/<track>/` first, then `<dir>/`); None where neither
    folder holds one (that cell is then not accepted). Stricter than the Dagster layer: any question
    file in those folders that cannot be read, or two for one item in one folder, is bad input."""
    from tica.errors import QuestionError
    from tica.evidence import EvidenceItem

    if not questions_dir.is_dir():
        raise InputError(questions_dir, "--questions", "no such folder of questions")
    folders = [(questions_dir / track, _question_hashes(questions_dir / track)),
               (questions_dir, _question_hashes(questions_dir))]
    out: dict[EvidenceItem, str | None] = {}
    for item in EvidenceItem:
        out[item] = None
        for folder, found in folders:
            hits = found.get(item, [])
            if len(hits) > 1:
                raise QuestionError(folder, "item", f"{len(hits)} questions for {item.value}: "
                                                    f"{', '.join(name for name, _ in hits)}")
            if hits:
                out[item] = hits[0][1]
                break
    return out


def _current_candidates(manifests: Sequence[Path], tracks: Sequence[str]) -> dict[str, tuple["CandidateIdentity", str]]:
    """Per track, the candidate its manifest names now and the manifest's description. A manifest
    of a track not asked for, or a second one for a track, is bad input."""
    from tica.candidate import identify
    from tica.errors import ManifestError
    from tica.fingerprint import FingerprintCache
    from tica.manifest import load_manifest

    cache = FingerprintCache()
    out: dict[str, tuple[CandidateIdentity, str]] = {}
    for path in manifests:
        loaded = load_manifest(path)
        track = loaded.manifest.track
        if track not in tracks:
            raise ManifestError(path, "track", f"names track {track!r}, which is not one of the tracks asked for "
                                               f"({', '.join(tracks)})")
        if track in out:
            raise ManifestError(path, "track", f"track {track!r} is named by an earlier --manifest too")
        out[track] = (identify(loaded, cache), loaded.manifest.description or "")
    with contextlib.suppress(OSError):  # the cache only saves time: a cache that cannot be written costs nothing
        cache.save()
    return out


def _read_reports(ledger: "LedgerStore", tracks: Sequence[str], current: dict[str, tuple["CandidateIdentity", str]],
                  questions_dir: Path) -> list["Report"]:
    """Each track's acceptance report, as the Dagster report asset builds it (no anchor head: the
    chain and views are verified as they stand). A ledger file DuckDB cannot read is bad input."""
    from tica.acceptance import report

    in_force = {track: questions_in_force(questions_dir, track) for track in tracks}
    reports = []
    for track in tracks:
        identity, conditions = current.get(track, (None, ""))
        try:
            reports.append(report(ledger, track, identity, conditions, questions=in_force[track]))
        except TicaError as err:  # a file DuckDB cannot open is bad input; a lock held too long is not
            raise _unreadable(ledger, err.__cause__) or err
        except Exception as err:
            raise _unreadable(ledger, err) or err
    return reports


def _unreadable(ledger: "LedgerStore", err: BaseException | None) -> InputError | None:
    """The ledger named as unreadable when `err` is DuckDB failing to read its file (not a lock)."""
    import duckdb

    from tica.ledger.connect import is_lock_error
    from tica.messages import plain

    if not isinstance(err, duckdb.Error) or is_lock_error(err):
        return None
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return InputError(ledger.path, "<file>", f"not a readable ledger: {_printable(plain(first))}")


def report_text(rep: "Report") -> str:
    """One track as text: the headline first, then one row per item (verdict, why, next step)."""
    from tica.acceptance import TITLES

    rows = [(TITLES[c.item], c.state, _printable(c.deciding or "—"), _printable(c.next_step or "—"))
            for c in rep.cells]
    candidate = rep.candidate_id or "unknown (no --manifest named this track)"
    return "\n".join([_printable(rep.headline), format_table(["evidence", "verdict", "why", "next step"], rows),
                      f"candidate {candidate}"])


def _write_page(path: Path, reports: Sequence["Report"]) -> None:
    from tica.report_html import render

    try:
        path.write_text(render(reports), encoding="utf-8")
    except OSError as err:
        raise InputError(path, "--html", f"cannot write: {err.strerror}") from None


def cmd_report(args: argparse.Namespace) -> int:
    """The acceptance report of each track named: exit 0 when every one is accepted, 1 when not."""
    request = _report_args(args)
    current = _current_candidates(request.manifests, request.tracks)
    ledger = _ledger(args).require_exists()
    reports = _read_reports(ledger, request.tracks, current, request.questions)
    for track in request.tracks:
        if track not in current:
            print(f"tica: note: no --manifest names track {track}, so the candidate it names now is unknown and "
                  "no verdict of it is shown as current", file=sys.stderr)
    if request.html is not None:
        _write_page(request.html, reports)
        print(f"tica: report page written to {request.html}", file=sys.stderr)
    print("\n\n".join(report_text(r) for r in reports))
    return EXIT_OK if all(r.accepted for r in reports) else EXIT_NO


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


def _ledger_views() -> str:
    from tica.ledger import TABLES, VIEWS

    return ("views to query (read-only): " + ", ".join(VIEWS) + "\ntables: " + ", ".join(TABLES)
            + "\nfor example: tica ledger query \"SELECT item, verdict, stale, failed_checks FROM track_verdicts "
              "WHERE track = 'cpu-tiny'\"")


def _judge_codes() -> tuple[tuple[int, str], ...]:
    from tica.judges import _EXIT_CODES

    verdicts = sorted(_EXIT_CODES.items(), key=lambda kv: kv[1])
    return (*((code, f"the cell is {verdict.value}") for verdict, code in verdicts),
            (EXIT_BAD_INPUT, "bad input: a malformed question, manifest or receipt (a receipt whose seal does not "
                             "match included), named with its field"))


HELP: dict[tuple[str, ...], Help] = {
    (): Help((
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
        "tica <verb> --help   (each verb lists its own exit codes)")),
    ("report",): Help((
        (EXIT_OK, "every track named is accepted for the candidate its manifest names now"),
        (EXIT_NO, "a track is not accepted (the report says why, per item)"),
        (EXIT_BAD_INPUT, "bad input: an unreadable manifest, question or ledger, a track name no manifest could "
                         "carry, a page that cannot be written (the file and field are named)"),
        (EXIT_OTHER, "a ledger whose chain or views do not verify (nothing is reported from it), a lock held too "
                     "long")), examples=(
        f"tica report cpu-tiny --manifest {M}",
        f"tica --ledger data/ledger.duckdb report cpu-tiny h200-mid4 --manifest {M} "
        "--manifest demo/candidates/h200-mid4.yaml --questions demo/questions --html report.html")),
    ("judge",): Help((), examples=(
        f"tica judge forward -q demo/questions/forward.yaml -m {M} -r LEGS_DIR",
        "tica judge throughput -q demo/questions/throughput.yaml -m M.yaml LEG1 LEG2 --json")),
    ("candidate",): Help((DONE, BAD, OTHER), examples=(f"tica candidate fingerprint {M}",)),
    ("candidate", "fingerprint"): Help((DONE, BAD), examples=(f"tica candidate fingerprint {M} --json",)),
    ("candidate", "diff"): Help((DONE, BAD), examples=("tica candidate diff old.yaml new.yaml",)),
    ("candidate", "record"): Help((DONE, BAD, OTHER),
                                  examples=(f"tica --ledger data/ledger.duckdb candidate record {M}",)),
    ("question",): Help((DONE, BAD, OTHER), examples=("tica question freeze demo/questions/forward.yaml",)),
    ("question", "freeze"): Help((DONE, (EXIT_BAD_INPUT, "bad input: a malformed question, or one that changes a "
                                                         "question already frozen under its name"), OTHER),
                                 examples=("tica question freeze demo/questions/forward.yaml --json",)),
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
    ("leg",): Help(((EXIT_OK, "the leg is written and sealed (run: every recorded process exited 0)"),
                    (EXIT_NO, "run: the leg is sealed, but the command or the server did not end cleanly"), BAD, OTHER),
                   examples=("tica leg run --help", "tica leg ingest --help")),
    ("leg", "run"): Help(((EXIT_OK, "the leg is sealed and every recorded process exited 0"),
                          (EXIT_NO, "the leg is sealed, but the command or the server did not end cleanly, or "
                                    "something named was not collected"), BAD, OTHER),
                         examples=("tica leg run --out LEG --item forward --arm bi1 -- python train.py",)),
    ("leg", "ingest"): Help(((EXIT_OK, "the leg is written and sealed"), BAD, OTHER),
                            examples=("tica leg ingest bench bench.json --out LEG --arm bi1 --round 1 --slot 1",)),
    ("plan",): Help(((EXIT_OK, "plan and draft written"), (EXIT_NO, "the pilot plans nothing (no draft written)"),
                     BAD, OTHER), examples=("tica plan throughput --help", "tica plan quality --help")),
    ("schema",): Help((DONE, BAD), examples=("tica schema --list", "tica schema manifest",
                                              "tica schema --out docs/schemas")),
}
for _verb in ("throughput", "quality"):
    HELP[("plan", _verb)] = Help(HELP[("plan",)].codes, examples=(
        f"tica plan {_verb} PILOT_LEGS... -q demo/questions/{_verb}.yaml --out draft.yaml",))


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


Verb = tuple[str, ...]  # the words that reach a parser: () for `tica`, ("ledger", "query"), ...


def walk(parser: argparse.ArgumentParser, path: Verb = ()) -> Iterator[tuple[Verb, argparse.ArgumentParser]]:
    """Every parser under `parser` (itself first), with the words that reach it."""
    yield path, parser
    for name, child in _children(parser).items():
        yield from walk(child, (*path, name))


def _add_help(parser: argparse.ArgumentParser) -> None:
    """Each verb's epilog (HELP), and raw formatting so its lines stay lines."""
    for path, p in walk(parser):
        entry = HELP.get(path)
        if entry is None:
            continue
        if p.formatter_class is argparse.HelpFormatter:
            p.formatter_class = argparse.RawDescriptionHelpFormatter
        p.epilog = judge_help_text if path == ("judge",) else entry.text


def judge_help_text() -> str:
    """`tica judge`'s exit codes, read from the judges' own table, and its examples."""
    return Help(_judge_codes(), HELP[("judge",)].examples).text()


def build_parser() -> argparse.ArgumentParser:
    parser = HelpParser(prog="tica", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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

    p = sub.add_parser("report", help="is each track accepted? one row per evidence item: verdict, why, next step",
                       description="The acceptance report of each TRACK from the ledger (--ledger), as the Dagster\n"
                                   "report asset builds it: per track the headline first (accepted or not, how many\n"
                                   "items pass, what decides the rest), then one row per evidence item.")
    p.add_argument("tracks", nargs="+", metavar="TRACK", help="a track (a manifest's `track:`)")
    p.add_argument("--manifest", action="append", metavar="M.yaml",
                   help="the manifest of one of the tracks (repeatable): the candidate it names now; a track "
                        "without one has no current candidate and is not accepted")
    p.add_argument("--questions", metavar="DIR", help="the questions folder (DIR/TRACK/ first, then DIR/), as "
                   "the Dagster layer reads it (default: $TICA_QUESTIONS_DIR, else demo/questions)")
    p.add_argument("--html", metavar="FILE", help="also write the report as one self-contained HTML page")
    p.set_defaults(func=cmd_report)

    from tica import ingest_cli, leg_run_cli, plan_cli, schema_cli

    leg_run_cli.add_parser(sub)
    ingest_cli.add_parser(sub)  # joins `tica leg`
    plan_cli.add_parser(sub)
    schema_cli.add_parser(sub)
    _add_help(parser)
    return parser


def _asks_help(argv: Sequence[str]) -> bool:
    words = list(argv[: list(argv).index("--")] if "--" in argv else argv)
    return "-h" in words or "--help" in words


def _judge(argv: list[str]) -> int:
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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["judge"]:
        # judging owns its arguments and exit codes (0 pass, 1 fail, 2 inconclusive, 3 not run, 4 bad input)
        return _judge(argv[1:])
    if "judge" in argv[1:] and all(a.startswith("-") or argv[i - 1] == "--ledger" for i, a in
                                   enumerate(argv[: argv.index("judge")])):
        print("tica: error: tica judge reads receipts and writes no ledger: give its options after `judge`, "
              "without --ledger", file=sys.stderr)
        return EXIT_BAD_INPUT
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
        return EXIT_OTHER


if __name__ == "__main__":
    raise SystemExit(main())
