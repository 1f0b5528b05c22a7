"""`tica report` on the command line and `--help` that helps.

One ledger holds two tracks: the false-pass suite's accepted track (`baseline`: materialized
through `tica.acceptance.materialize`, bound and frozen first) and a second track that is not
accepted (one item materialized the same way and accepted, one fail, one inconclusive, the rest
not run). `tica report` must print each track's headline first, then its table; exit 0 only when
every track named is accepted, 1 when one is not, 4 for bad input naming the file, 5 for a ledger
that does not verify. Every verb's --help lists its exit codes and examples, `tica judge --help`
the judges' own codes, `tica ledger query --help` every view the ledger defines."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.false_pass import conftest as fp
from tests.false_pass.test_acceptance import IN_FORCE, TRACK, Track, _materialize  # `baseline`: tests/conftest.py
from tica.acceptance import Report, report
from tica.candidate import CandidateIdentity, identify
from tica.cli import EXIT_NO, EXIT_OK, EXIT_OTHER, HELP, build_parser, main, walk
from tica.cli.report import questions_in_force
from tica.errors import EXIT_BAD_INPUT
from tica.evidence import EvidenceItem
from tica.ledger import VIEWS, Ledger
from tica.manifest import load_manifest
from tica.records import record_verdict
from tica.verdict import Verdict

E = EvidenceItem
REFUSED = "not-accepted"
ROOT = Path(__file__).resolve().parents[2]
# Every element the page may hold: no script, no link, no image, no frame, nothing that loads.
PAGE_TAGS = {"html", "head", "meta", "title", "style", "body", "header", "p", "section", "h2", "table", "thead",
             "tbody", "tr", "th", "td", "span", "code", "div", "details", "summary", "ul", "li", "footer"}


@dataclass
class TwoTracks:
    root: Path
    ledger: Path
    questions: Path
    manifests: dict[str, Path]
    identities: dict[str, CandidateIdentity]
    fail_summary: str

    def report(self, track: str) -> Report:
        return report(Ledger(self.ledger), track, self.identities[track], questions=IN_FORCE)

    def argv(self, *tracks: str, html: Path | None = None) -> list[str]:
        out = ["--ledger", str(self.ledger), "report", *tracks, "--questions", str(self.questions)]
        out += [a for t in tracks for a in ("--manifest", str(self.manifests[t]))]
        return out + (["--html", str(html)] if html else [])


def _record_as(ledger: Ledger, identity: CandidateIdentity, t: Track, item: EvidenceItem, verdict: Verdict,
               summary: str) -> None:
    """A verdict of `item` for another candidate: the accepted track's cell with another verdict,
    its checks kept (all passed: the verdict alone keeps it from being accepted)."""
    judged = t.materialized[item].current
    cell = judged.cell.model_copy(update={"verdict": verdict, "summary": summary, "reasons": (summary,)})
    record_verdict(ledger, identity.candidate_id, cell, checks=judged.checks)


@pytest.fixture(scope="module")
def two_tracks(baseline, tmp_path_factory) -> TwoTracks:
    root = tmp_path_factory.mktemp("report-cli")
    for src in baseline.ledger_path.parent.glob(baseline.ledger_path.name + "*"):
        if not src.name.endswith(".lock"):
            shutil.copy2(src, root / src.name)
    ledger = Ledger(root / baseline.ledger_path.name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TICA_CACHE_DIR", str(root / "fingerprint-cache"))
        manifest = fp.write_manifest(root / "other", fp.manifest_data(track=REFUSED, description="a <b>bold claim"))
        loaded = load_manifest(manifest)
        other = identify(loaded)
        _materialize(ledger, baseline, E.FORWARD, root / "legs" / "forward", loaded=loaded, identity=other)
        leg = root / "legs" / "backward" / "leg-0" / "grads.safetensors"
        fail = f"fail: the gradients differ past the line in {leg} <img src=x onerror=window.pwned=1>"
        _record_as(ledger, other, baseline, E.BACKWARD, Verdict.FAIL, fail)
        _record_as(ledger, other, baseline, E.UPDATE, Verdict.INCONCLUSIVE, "inconclusive: the update was not seen")
    tracks = TwoTracks(root, ledger.path, baseline.questions[E.FORWARD].parent,
                       {TRACK: baseline.manifest, REFUSED: manifest}, {TRACK: baseline.identity, REFUSED: other}, fail)
    assert tracks.report(TRACK).accepted, "negative control: the baseline track is accepted in the copied ledger"
    assert not tracks.report(REFUSED).accepted
    return tracks


@pytest.fixture(autouse=True)
def _fingerprint_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TICA_CACHE_DIR", str(tmp_path / "fingerprint-cache"))


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def help_of(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


# ------------------------------------------------------------------ the report as text, and its exit codes


def blocks(out: str) -> list[list[str]]:
    return [b.splitlines() for b in out.strip("\n").split("\n\n")]


def test_report_prints_each_headline_first_then_one_row_per_item(two_tracks, capsys):
    code, out, err = run_cli(two_tracks.argv(TRACK, REFUSED), capsys)
    assert code == EXIT_NO, err
    accepted, refused = blocks(out)
    for lines, track in ((accepted, TRACK), (refused, REFUSED)):
        rep = two_tracks.report(track)
        assert lines[0] == rep.headline
        assert re.split(r"\s{2,}", lines[1]) == ["evidence", "verdict", "why", "next step"]
        rows = lines[3:3 + len(rep.cells)]
        for row, cell in zip(rows, rep.cells):
            assert cell.state in row and (cell.next_step or "—") in row, (row, cell.state)
        assert lines[-1] == f"candidate {two_tracks.identities[track].candidate_id}"
    assert accepted[0] == f"{TRACK}: accepted — 7 of 7 pass"
    assert refused[0].startswith(f"{REFUSED}: not accepted — 1 of 7 pass; 1 fail (backward)"), refused[0]
    states = {re.split(r"\s{2,}", row)[0]: re.split(r"\s{2,}", row)[1] for row in refused[3:10]}
    assert states["module backward"] == "fail" and states["real update"] == "inconclusive"
    assert states["train-inference forward"] == "accepted" and states["clean exit"] == "not run"
    assert str(two_tracks.root) not in out, "no absolute path in what a person reads"


def test_exit_0_only_when_every_track_named_is_accepted(two_tracks, capsys):
    assert run_cli(two_tracks.argv(TRACK), capsys)[0] == EXIT_OK  # negative control
    assert run_cli(two_tracks.argv(REFUSED), capsys)[0] == EXIT_NO
    assert run_cli(two_tracks.argv(REFUSED, TRACK), capsys)[0] == EXIT_NO


def test_a_track_without_its_manifest_is_never_accepted(two_tracks, capsys):
    argv = ["--ledger", str(two_tracks.ledger), "report", TRACK, "--questions", str(two_tracks.questions)]
    code, out, err = run_cli(argv, capsys)
    assert code == EXIT_NO and out.startswith(f"{TRACK}: not accepted — 0 of 7 pass; 7 stale"), out
    assert f"no --manifest names track {TRACK}" in err


def test_a_track_under_questions_it_does_not_ask_is_never_accepted(two_tracks, tmp_path, capsys):
    """The same verdicts, read against a questions folder that asks another quality question now."""
    questions = shutil.copytree(two_tracks.questions, tmp_path / "questions")
    path = questions / "quality.yaml"
    path.write_text(path.read_text().replace("gsm8k-30-greedy", "gsm8k-30-greedy-edited", 1))
    argv = two_tracks.argv(TRACK)
    argv[argv.index("--questions") + 1] = str(questions)
    code, out, _ = run_cli(argv, capsys)
    assert code == EXIT_NO and "1 stale (quality)" in out.splitlines()[0], out


def test_questions_in_force_are_those_the_dagster_layer_finds(two_tracks):
    from tica.question import load_question
    from tica_assets.core import find_question
    from tica_assets.tracks import discover_tracks

    assert questions_in_force(two_tracks.questions, TRACK) == IN_FORCE
    demo = ROOT / "demo" / "questions"
    for track in [t.name for t in discover_tracks(ROOT / "demo" / "candidates")]:
        assert questions_in_force(demo, track) == {
            item: load_question(find_question(demo, track, item)).hash for item in EvidenceItem}, track


# ------------------------------------------------------------------ bad input: exit 4, naming the file


def _broken_manifest(two_tracks: TwoTracks, tmp_path: Path) -> Path:
    path = tmp_path / "broken.yaml"
    path.write_text(two_tracks.manifests[TRACK].read_text().replace("track:", "track: [", 1))
    return path


def test_bad_input_exits_4_naming_the_file_and_field(two_tracks, tmp_path, capsys):
    broken_question = shutil.copytree(two_tracks.questions, tmp_path / "questions")
    (broken_question / "forward.yaml").write_text("name: [unclosed\n")
    not_a_ledger = tmp_path / "ledger.duckdb"
    not_a_ledger.write_bytes(b"not a DuckDB file at all " * 200)
    other_manifest = two_tracks.manifests[REFUSED]
    cases = {
        "manifest": (lambda a: a.__setitem__(a.index("--manifest") + 1, str(_broken_manifest(two_tracks, tmp_path))),
                     "broken.yaml: <yaml>"),
        "question": (lambda a: a.__setitem__(a.index("--questions") + 1, str(broken_question)), "forward.yaml: "),
        "no questions folder": (lambda a: a.__setitem__(a.index("--questions") + 1, str(tmp_path / "nowhere")),
                                "nowhere: --questions: no such folder"),
        "missing ledger": (lambda a: a.__setitem__(1, str(tmp_path / "absent.duckdb")),
                           "absent.duckdb: no ledger here"),
        "unreadable ledger": (lambda a: a.__setitem__(1, str(not_a_ledger)), "ledger.duckdb: <file>: not a readable"),
        "another track's manifest": (lambda a: a.__setitem__(a.index("--manifest") + 1, str(other_manifest)),
                                     f"candidate.yaml: track: names track '{REFUSED}'"),
        "not a track name": (lambda a: a.__setitem__(a.index("report") + 1, "No Such/Track"), "tracks.0: "),
        "page not writable": (lambda a: a.extend(["--html", str(tmp_path / "no" / "dir" / "page.html")]),
                              "page.html: --html: cannot write"),
    }
    for name, (edit, names) in cases.items():
        argv = two_tracks.argv(TRACK)
        edit(argv)
        code, out, err = run_cli(argv, capsys)
        assert code == EXIT_BAD_INPUT, (name, code, err)
        first = err.splitlines()[0]  # (a YAML error goes on with the parser's own lines, pointing at the place)
        assert first.startswith("tica: error: ") and names in first, (name, err)
        assert out == "", (name, out)


def test_a_ledger_that_does_not_verify_is_not_reported_from(two_tracks, tmp_path, capsys):
    import duckdb

    ledger = tmp_path / "edited.duckdb"
    shutil.copy2(two_tracks.ledger, ledger)
    with duckdb.connect(str(ledger)) as con:
        con.execute("UPDATE verdicts SET verdict = 'pass' WHERE verdict = 'fail'")
    argv = two_tracks.argv(REFUSED)
    argv[1] = str(ledger)
    code, out, err = run_cli(argv, capsys)
    assert code == EXIT_OTHER and out == "" and "tica: error:" in err, (code, err)


def test_the_html_page_is_self_contained_escaped_and_plain(two_tracks, tmp_path, capsys):
    page = tmp_path / "report.html"
    code, _, err = run_cli(two_tracks.argv(TRACK, REFUSED, html=page), capsys)
    assert code == EXIT_NO and "report page written" in err
    text = page.read_text()
    tags = re.findall(r"<([a-zA-Z][\w-]*)([^>]*)>", text)
    assert {name.lower() for name, _ in tags} <= PAGE_TAGS, {name for name, _ in tags} - PAGE_TAGS
    assert not any(re.search(r"\b(src|href|on\w+)\s*=", attrs, re.I) for _, attrs in tags), "a tag that loads or runs"
    assert not re.search(r"url\(|@import|https?://", text, re.I), "an external resource"
    assert "&lt;img src=x onerror=window.pwned=1&gt;" in text and "a &lt;b&gt;bold claim" in text
    assert str(two_tracks.root) not in text and not re.search(r"(?<![\w.])/(?:tmp|home|work|root)/", text)
    assert "leg-0/grads.safetensors" in text  # the path shown by its last two parts
    for track in (TRACK, REFUSED):
        rep = two_tracks.report(track)
        assert html.escape(rep.headline) in text
        for cell in rep.cells:
            if cell.question_hash:
                assert f"{cell.question_hash[:19]}…" in text


# ------------------------------------------------------------------ --help


def test_every_verb_help_lists_its_exit_codes_and_examples(capsys):
    parser = build_parser()
    for path, sub in walk(parser):
        text = sub.format_help()
        codes = HELP[path].codes if path != ("judge",) else ()
        assert "exit codes:" in text and "examples:" in text, path
        for code, _ in codes:
            assert re.search(rf"^  {code}  \S", text, re.M), (path, code)
        assert re.search(rf"^  {EXIT_BAD_INPUT}  bad input", text, re.M), path
    assert {p for p, _ in walk(parser)} <= set(HELP) | {()}, "a verb without its exit codes"


def test_top_level_help_names_every_exit_code_the_verbs_use(capsys):
    from tica.judges import _EXIT_CODES

    text = help_of([], capsys)
    for code in {*_EXIT_CODES.values(), EXIT_OK, EXIT_NO, EXIT_BAD_INPUT, EXIT_OTHER}:
        assert re.search(rf"^  {code}  \S", text, re.M), code
    assert "tica ledger query" in text and "report" in text


def test_report_help_names_the_codes_it_returns(capsys):
    text = help_of(["report"], capsys)
    for code in (EXIT_OK, EXIT_NO, EXIT_BAD_INPUT, EXIT_OTHER):
        assert re.search(rf"^  {code}  \S", text, re.M), code
    assert "tica report cpu-tiny --manifest demo/candidates/cpu-tiny.yaml" in text


def test_judge_help_lists_the_judges_own_exit_codes(capsys):
    from tica.judges import _EXIT_CODES

    code, out, _ = run_cli(["judge", "--help"], capsys)
    assert code == 0 and out.startswith("usage: tica judge")
    for verdict, exit_code in _EXIT_CODES.items():
        assert f"  {exit_code}  the cell is {verdict.value}" in out
    assert f"  {EXIT_BAD_INPUT}  bad input" in out and "examples:" in out


def test_ledger_query_help_lists_every_view(capsys):
    text = help_of(["ledger", "query"], capsys)
    listed = re.search(r"^views to query \(read-only\): (.+)$", text, re.M)
    assert listed and set(listed.group(1).split(", ")) == set(VIEWS), text
    assert "track_verdicts" in VIEWS  # the view the examples query


def test_help_stays_light():
    """`tica --help` lists the views only when `tica ledger query --help` is asked: DuckDB is not
    imported to show the top-level help (benchmarks/cli_startup.py)."""
    probe = ("import sys; from tica.cli import build_parser; p = build_parser(); p.format_help(); "
             "print('duckdb' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


def test_judge_after_a_global_ledger_option_is_refused_by_name_not_a_traceback(capsys):
    from tica.cli import main

    assert main(["--ledger", "x.duckdb", "judge", "forward"]) == 4
    err = capsys.readouterr().err
    assert "judge" in err and "--ledger" in err and "Traceback" not in err
