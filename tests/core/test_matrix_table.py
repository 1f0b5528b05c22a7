"""The matrix's table (tica/matrix_table.py) over cells made here: what it counts, what it never
counts as a pass, and what a receipt set that cannot be read gives. The committed receipts replayed
through the Dagster asset: tests/dagster/test_dagster_matrix.py."""

from __future__ import annotations

from pathlib import Path

from tica.judges.matrix import MatrixCell
from tica.matrix_table import ROUTING, replay_matrix, shape_table, table_markdown, verdict_counts
from tica.verdict import Verdict

ROOT = Path(__file__).resolve().parents[2]
QUESTION = ROOT / "demo" / "questions" / "h200-matrix" / "forward.yaml"
FLIP = ("routing differs first at sequence 0 position 5, MoE layer 1 (rollout experts [1, 2], trainer [1, 3]); "
        "1 of 64 token-layer routes differ, at 1 tokens; 0 of 4 logprobs differ where every route up to them matched")
SAME = "routing identical at all 64 tokens x 2 MoE layers (top-2)"


def cell(load: str, scored: str, verdict: Verdict, candidate: str = "stock", shape: str = "s1",
         run: str = "r1", routing: str | None = None) -> MatrixCell:
    return MatrixCell(run=run, candidate=candidate, overlay_parts=(), shape=shape, load=load, scored=scored,
                      verdict=verdict, n_diff=None, n_tokens=None, vllm_decode_vs_prefill=None,
                      cause=None if verdict is Verdict.PASS else "x", reasons=(), routing=routing)


def test_a_column_counts_every_load_and_the_cells_after_the_update():
    cells = [cell("c1", "decode", Verdict.PASS), cell("c64", "decode", Verdict.FAIL),
             cell("c64", "decode_post_update", Verdict.PASS), cell("c1", "prefill", Verdict.PASS)]
    table = shape_table(cells)
    assert table.columns == ("run", "shape", "stock decode", "stock prefill")  # no routes recorded: no route column
    assert table.rows == ({"run": "r1", "shape": "s1", "stock decode": "2/3 pass", "stock prefill": "1/1 pass"},)


def test_a_cell_neither_passed_nor_failed_is_counted_against_the_pass_and_named():
    table = shape_table([cell("c1", "decode", Verdict.PASS), cell("c16", "decode", Verdict.INCONCLUSIVE),
                         cell("c64", "decode", Verdict.NOT_RUN)])
    assert table.rows[0]["stock decode"] == "1/3 pass (1 inconclusive, 1 not run)"


def test_rows_are_per_run_and_shape_and_a_column_a_row_lacks_is_a_dash():
    table = shape_table([cell("c1", "decode", Verdict.PASS, run="r1"), cell("c1", "decode", Verdict.FAIL, run="r2"),
                         cell("c1", "prefill", Verdict.PASS, candidate="overlay3", run="r2")])
    assert [(r["run"], r["stock decode"], r["overlay3 prefill"]) for r in table.rows] == [
        ("r1", "1/1 pass", "—"), ("r2", "0/1 pass", "1/1 pass")]
    assert table_markdown(table).splitlines()[2] == "| r1 | s1 | — | 1/1 pass |"


def test_the_route_column_names_the_first_flip_of_a_failing_cell_only():
    cells = [cell("c1", "decode", Verdict.PASS, routing=SAME), cell("c16", "decode", Verdict.FAIL, routing=SAME),
             cell("c64", "decode", Verdict.FAIL, routing=FLIP)]
    assert shape_table(cells).rows[0][ROUTING] == ("stock decode c64: routing differs first at sequence 0 position 5, "
                                                   "MoE layer 1 (rollout experts [1, 2], trainer [1, 3])")
    assert shape_table(cells[:2]).rows[0][ROUTING] == "routes identical in every failing cell"
    # control: a flip recorded in a cell that passed is the judge's business, not a failing cell's note
    assert shape_table([cell("c1", "decode", Verdict.PASS, routing=FLIP)]).rows[0][ROUTING] == "—"


def test_verdict_counts_read_as_the_pin_does():
    cells = [cell("c1", "decode", Verdict.PASS), cell("c16", "decode", Verdict.FAIL),
             cell("c64", "decode", Verdict.PASS, run="moe1")]
    assert verdict_counts(cells) == ["moe1: pass x 1", "r1: fail x 1", "r1: pass x 1"]


def test_receipts_that_cannot_be_read_are_not_run_and_say_why_in_one_sentence(tmp_path):
    missing = replay_matrix(QUESTION, tmp_path / "gone.tar.xz", tmp_path / "cache")
    assert missing.cells == () and missing.not_run.startswith("not run: ") and "no such archive" in missing.not_run
    assert str(tmp_path) not in missing.not_run  # no absolute path in a message a person reads
    empty = replay_matrix(QUESTION, (tmp_path / "empty").resolve(), tmp_path / "cache")
    assert empty.cells == () and "no such folder" in empty.not_run
    (tmp_path / "empty").mkdir()
    assert replay_matrix(QUESTION, tmp_path / "empty").not_run.endswith("holds no matrix cell")
    (tmp_path / "empty" / "run" / "not-a-cell").mkdir(parents=True)
    (tmp_path / "empty" / "run" / "not-a-cell" / "leg.json").write_text("{}")
    refused = replay_matrix(QUESTION, tmp_path / "empty")
    assert refused.cells == () and "is not a matrix cell" in refused.not_run
    no_question = replay_matrix(tmp_path / "forward.yaml", tmp_path / "empty")
    assert no_question.cells == () and no_question.not_run.startswith("not run: ")
