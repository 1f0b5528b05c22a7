"""The report reads a track's verdicts by a track-first query (tica.ledger.schema.TRACK_VERDICTS_SQL, the
views untouched): it must return exactly what `SELECT * FROM track_verdicts WHERE track = ?`
returns, on a ledger where every part of the view has something to say. The indexes it uses are
created by the schema setup, and a ledger made before them still opens, verifies and gains them.
(The same comparison on Postgres: tests/scale/test_postgres_report_query.py.)"""

from __future__ import annotations

import duckdb

from tica.acceptance import report
from tica.evidence import EvidenceItem
from tica.ledger import INDEXES, TRACK_VERDICTS_SQL, Ledger

VIEW_SQL = "SELECT * FROM track_verdicts WHERE track = ?"
TRACKS = ("alpha", "beta", "gamma", "empty", "no-such-track")


def build_story(ledger) -> None:
    """Three tracks, several candidates per track, reruns, invalidations (voiding, not voiding,
    before and after the verdict, moving the track to the verdict's own candidate), checks passed,
    failed, advisory, required-but-marked-advisory, judged after the fact, a verdict with no checks,
    a verdict whose candidate was never recorded, a candidate recorded twice, non-ASCII text."""
    n = 0

    def verdict(cand: str, item: str, verdict: str, checks: list[tuple[str, int, int]] = (), rerun_of=None) -> str:
        nonlocal n
        n += 1
        vid = f"v{n}"
        rows = [("verdicts", {"verdict_id": vid, "candidate_id": cand, "item": item, "question_hash": f"q-{item}",
                              "verdict": verdict, "summary": f"{item} {verdict} ünïcode {n}",
                              "numbers_json": {"x": n / 3, "nested": [1, {"y": None}]},
                              "judge_version": "j1", "rerun_of": rerun_of})]
        rows += [("checks", {"check_id": f"k{n}-{k}", "verdict_id": vid, "name": name, "blocking": blocking,
                             "passed": passed, "description": f"{name} d"}) for k, (name, blocking, passed) in enumerate(checks)]
        ledger.append_many(rows)
        return vid

    def candidate(cid: str, track: str) -> None:
        ledger.append("candidates", {"candidate_id": cid, "track": track, "manifest_hash": f"h-{cid}"})

    def invalidate(track: str, old: str, new: str, item: str, component: str = "weights") -> None:
        nonlocal n
        n += 1
        ledger.append("invalidations", {"invalidation_id": f"i{n}", "track": track, "old_candidate_id": old,
                                        "new_candidate_id": new, "component": component, "item": item,
                                        "cause": f"{component} changed {n}"})

    ok = [("canaries_caught", 1, 1), ("receipts_sealed", 1, 1), ("frozen_before_run", 1, 1)]
    candidate("a1", "alpha")
    candidate("b1", "beta")
    for item in ("forward", "backward", "quality"):
        first = verdict("a1", item, "fail", ok)
        verdict("a1", item, "pass", ok, rerun_of=first)  # a rerun: the newest wins
    verdict("b1", "forward", "pass", [("canaries_caught", 1, 0), ("receipts_sealed", 0, 0), ("advisory", 0, 0),
                                      ("frozen_before_run", 1, 1)])
    verdict("b1", "throughput", "pass", [("frozen_before_run", 1, 0)])  # judged after the fact
    verdict("b1", "clean_exit", "pass")  # no checks at all
    invalidate("alpha", "a1", "a2", "forward")  # voids a1's forward
    invalidate("alpha", "a1", "a2", "forward", "runtime")  # a second cause, joined in seq order
    candidate("a2", "alpha")
    candidate("a2", "alpha")  # recorded twice
    verdict("a2", "backward", "pass", ok)  # newer than a1's backward on the same track
    invalidate("alpha", "a1", "a2", "backward")  # after a2's verdict, but moves the track to a2: not stale
    invalidate("alpha", "a2", "a3", "quality")  # a1's quality is older, on another candidate: still voided
    verdict("a1", "quality", "fail", ok)  # after that invalidation: a1's newest quality is fresh
    invalidate("beta", "b1", "b2", "throughput", "dataset")
    invalidate("gamma", "b1", "b2", "forward")  # another track's invalidation voids nothing here
    verdict("ghost", "forward", "pass", ok)  # a candidate never recorded: no track
    candidate("g1", "gamma")
    for k in range(3):
        verdict("g1", "artifacts", ("pass", "fail", "inconclusive")[k], ok[: k + 1])
    candidate("g2", "gamma")
    verdict("g2", "update", "pass", ok)
    verdict("g1", "update", "fail", ok)  # newest on the track, though g2 came later
    candidate("e1", "empty")  # a track with a candidate and no verdicts


def _rows(ledger, sql: str, track: str) -> tuple[list[str], list[tuple]]:
    columns, rows = ledger.query(sql, [track])
    return columns, sorted(rows, key=repr)


def assert_same_as_the_view(ledger) -> None:
    nonempty = 0
    for track in TRACKS:
        view_cols, view_rows = _rows(ledger, VIEW_SQL, track)
        cols, rows = _rows(ledger, TRACK_VERDICTS_SQL, track)
        assert cols == view_cols, track
        assert rows == view_rows, track
        assert sorted(ledger.track_verdicts(track), key=repr) == sorted(ledger.rows(VIEW_SQL, [track]), key=repr)
        nonempty += bool(rows)
    assert nonempty == 3
    stale = {(r["track"], r["item"]): r["stale_cause"] for t in TRACKS for r in ledger.track_verdicts(t)}
    assert stale[("alpha", "forward")].startswith("weights: weights changed ")
    assert "; runtime: runtime changed " in stale[("alpha", "forward")]
    assert stale[("alpha", "backward")] is None and stale[("alpha", "quality")] is None
    assert stale[("beta", "throughput")].startswith("dataset: ")


def test_the_track_first_query_returns_exactly_the_views_rows(tmp_path):
    ledger = Ledger(tmp_path / "l.duckdb")
    build_story(ledger)
    assert ledger.verify().ok
    assert_same_as_the_view(ledger)
    by_item = {r["item"]: r for r in ledger.track_verdicts("beta")}
    assert by_item["forward"]["failed_checks"] == "canaries_caught, receipts_sealed"
    assert by_item["throughput"]["after_the_fact"] is True and by_item["clean_exit"]["checks"] is None
    assert by_item["clean_exit"]["after_the_fact"] is False


def test_the_report_reads_the_same_cells_as_from_the_view(tmp_path):
    ledger = Ledger(tmp_path / "l.duckdb")
    build_story(ledger)
    rep = report(ledger, "alpha", None)
    view = {r["item"]: r for r in ledger.rows(VIEW_SQL, ["alpha"])}
    for cell in rep.cells:
        r = view.get(cell.item.value)
        if r is None:
            assert cell.verdict_id is None
            continue
        assert (cell.verdict_id, cell.verdict, cell.summary, cell.after_the_fact) == (
            r["verdict_id"], r["verdict"], r["summary"], r["after_the_fact"])
        assert cell.stale_cause == (r["stale_cause"] or "the manifest could not be read: the candidate it names now is unknown")
    assert {c.item for c in rep.cells} == set(EvidenceItem)


def _index_names(path) -> set[str]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {r[0] for r in con.execute("SELECT index_name FROM duckdb_indexes()").fetchall()}
    finally:
        con.close()


def test_the_indexes_are_made_and_are_not_tampering(tmp_path):
    ledger = Ledger(tmp_path / "l.duckdb")
    build_story(ledger)
    assert set(INDEXES) <= _index_names(ledger.path)
    report_ = ledger.verify()
    assert report_.ok, report_.problems


def test_a_ledger_made_before_the_indexes_opens_verifies_and_gains_them(tmp_path):
    path = tmp_path / "old.duckdb"
    build_story(Ledger(path))
    con = duckdb.connect(str(path))
    for name in INDEXES:
        con.execute(f"DROP INDEX {name}")
    con.close()
    assert not set(INDEXES) & _index_names(path)
    old = Ledger(path)
    before = old.verify()
    assert before.ok, before.problems
    assert_same_as_the_view(old)  # read without the indexes: the same rows
    assert not set(INDEXES) & _index_names(path)  # reading adds nothing
    old.append("reruns", {"rerun_id": "r1", "original_kind": "verdict", "original_id": "v1", "new_id": "v2"})
    assert set(INDEXES) <= _index_names(path)  # the first write adds them
    after = Ledger(path).verify()
    assert after.ok and after.rows == before.rows + 1
    assert_same_as_the_view(Ledger(path))
