"""The report's first line: accepted or not, how many items pass, and per kind of non-pass what
decides the first of them, in one sentence each (no verdict prefix twice, no absolute path)."""

from __future__ import annotations

from tica.acceptance import Report, ReportCell
from tica.evidence import EvidenceItem as E
from tica_assets.settings import PROJECT_ROOT


def _cell(item: E, verdict: str, **kw) -> ReportCell:
    return ReportCell(item, verdict, kw.pop("summary", f"{verdict}: summary"), kw.pop("question_hash", "sha256:q"),
                      "cand-1", f"verdict-{item.value}", "judge/1", **kw)


def _report(*cells: ReportCell) -> Report:
    given = {c.item for c in cells}
    return Report("t", "cand-1", tuple(cells) + tuple(_cell(i, "pass") for i in E if i not in given))


def test_every_item_accepted_reads_accepted():
    assert _report().headline == "t: accepted — 7 of 7 pass"


def test_a_pass_with_a_blocking_reason_is_not_counted_as_a_pass():
    rep = _report(_cell(E.FORWARD, "pass", blocking=("the question the track asks now is not known",)))
    assert rep.headline == ("t: not accepted — 6 of 7 pass; 1 pass, not accepted (forward): the question the track "
                            "asks now is not known")


def test_non_passes_are_grouped_worst_first_each_with_what_decides_it():
    rep = _report(
        _cell(E.BACKWARD, "not run", reasons=("not run: not run: vLLM batch-invariant mode is not supported on "
                                              "platform 'cpu'; more",)),
        _cell(E.THROUGHPUT, "inconclusive",
              reasons=("note: x", f"inconclusive: about 6 more crossed rounds at c=2 ({PROJECT_ROOT}/data/legs/r1)")),
        _cell(E.QUALITY, "fail", reasons=("fail: BI=1 60% vs BI=0 80%",)),
        _cell(E.UPDATE, "pass", stale_cause="weights: weights blake3:aa -> blake3:bb: new weights"),
    )
    assert rep.headline == (
        "t: not accepted — 3 of 7 pass; 1 fail (quality): BI=1 60% vs BI=0 80%; "
        "1 inconclusive (throughput): about 6 more crossed rounds at c=2 (data/legs/r1); "
        "1 not run (backward): vLLM batch-invariant mode is not supported on platform 'cpu'; "
        "1 stale (update): weights changed since it was judged")
    assert all(c.next_step for c in rep.cells if not c.accepted)
    assert not any(c.next_step for c in rep.cells if c.accepted)


def test_an_item_with_no_verdict_says_so_and_how_to_get_one():
    cell = _cell(E.ARTIFACTS, "not run", summary="no verdict recorded", question_hash=None)
    assert (cell.deciding, cell.next_step) == ("no verdict recorded", "materialize artifacts")


def test_a_leg_that_did_not_run_is_decided_by_its_reason_not_its_label():
    cell = _cell(E.FORWARD, "not run", reasons=("not run: bi1 bi1-s1: did not run: BI=1 needs a GPU because vLLM's "
                                                 "batch-invariant mode is not supported on the CPU platform",))
    assert cell.deciding == "BI=1 needs a GPU because vLLM's batch-invariant mode is not supported on the CPU platform"
    # control: a reason that names no leg keeps its words
    assert _cell(E.FORWARD, "not run", reasons=("not run: no legs named",)).deciding == "no legs named"
