"""`tica report`: is each track accepted? The acceptance report from the ledger, as text or a page."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tica.cli._common import (CLI, EXIT_NO, EXIT_OK, EXIT_OTHER, Help, M, Verb, format_table, ledger_of,
                              printable)
from tica.errors import EXIT_BAD_INPUT, InputError, TicaError

if TYPE_CHECKING:
    from tica.acceptance import Report
    from tica.candidate import CandidateIdentity
    from tica.evidence import EvidenceItem
    from tica.ledger import LedgerStore

HELP: dict[Verb, Help] = {
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
}


def add_parser(subparsers: Any) -> None:
    """Add `report` to the `tica` subparsers object."""
    p = subparsers.add_parser("report", help="is each track accepted? one row per evidence item: verdict, why, next step",
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


QUESTION_SUFFIXES = (".yaml", ".yml")  # as tica_assets.core.find_question reads a questions folder
TRACK_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"  # as a manifest's `track:` (tica.manifest.Manifest)


def _report_args(args: argparse.Namespace):
    """The report's arguments, validated (pydantic): a track name a manifest could carry, a
    questions folder ($TICA_QUESTIONS_DIR, else demo/questions), manifests and the page path."""
    from typing import Annotated

    from pydantic import BaseModel, ConfigDict, Field, ValidationError

    from tica.errors import pydantic_errors
    from tica.settings import setting

    class ReportArgs(BaseModel):
        model_config = ConfigDict(extra="forbid", frozen=True)

        tracks: list[Annotated[str, Field(pattern=TRACK_PATTERN)]] = Field(min_length=1)
        manifests: list[Path] = []
        questions: Path
        html: Path | None = None

    try:
        return ReportArgs(tracks=list(dict.fromkeys(args.tracks)), manifests=args.manifest or [],
                          questions=args.questions or str(setting("questions_dir")),
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
    return InputError(ledger.path, "<file>", f"not a readable ledger: {printable(plain(first))}")


def report_text(rep: "Report") -> str:
    """One track as text: the headline first, then one row per item (verdict, why, next step)."""
    from tica.acceptance import TITLES

    rows = [(TITLES[c.item], c.state, printable(c.deciding or "—"), printable(c.next_step or "—"))
            for c in rep.cells]
    candidate = rep.candidate_id or "unknown (no --manifest named this track)"
    return "\n".join([printable(rep.headline), format_table(["evidence", "verdict", "why", "next step"], rows),
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
    ledger = ledger_of(args).require_exists()
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

