"""The matrix assets (tica_assets/matrix.py) materialized in-process: the committed matrix receipts
replayed through the matrix judge, their table in the materialization's metadata. The counts the
table shows are the pinned ones (tests/fixtures/committed_verdicts.txt); a cell planted to fail
shows failing, and receipts that cannot be read are not run, never a table of passes."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from dagster import DagsterInstance, materialize

from tica.canaries import perturb_arrays
from tica.items.forward.canaries import flip_route
from tica.receipt_archive import unpacked
from tica_assets.definitions import build_defs
from tica_assets.matrix import MATRIX_JOB, MATRIX_SETS, MatrixSet, matrix_asset, matrix_defs, matrix_key
from tica_assets.settings import PROJECT_ROOT, Settings

PIN = PROJECT_ROOT / "tests" / "fixtures" / "committed_verdicts.txt"
SETS = {m.name: m for m in MATRIX_SETS}
MARK = re.compile(r"^(\d+)/(\d+) pass")


@pytest.fixture
def settings(tmp_path, monkeypatch) -> Settings:
    monkeypatch.setenv("TICA_RECEIPTS_CACHE", str(tmp_path / "receipts"))
    return Settings(candidates_dir=tmp_path / "candidates", questions_dir=PROJECT_ROOT / "demo" / "questions",
                    ledger_path=tmp_path / "ledger.duckdb", data_dir=tmp_path / "data")


def metadata(settings: Settings, *sets: MatrixSet) -> dict[str, dict]:
    """Each set's materialization metadata, by set name, the table as its rows."""
    result = materialize([matrix_asset(m, settings) for m in sets], instance=DagsterInstance.ephemeral())
    assert result.success
    out = {}
    for event in result.get_asset_materialization_events():
        meta = event.materialization.metadata
        shown = {k: getattr(v, "text", None) for k, v in meta.items() if k != "table"}
        shown["rows"] = [r.data for r in meta["table"].records] if "table" in meta else None
        out[event.asset_key.path[-1]] = shown
    return out


def pinned(run: str) -> dict[str, int]:
    out = {}
    for line in PIN.read_text().splitlines():
        m = re.fullmatch(rf"matrix/{run}: (\w[\w ]*) x (\d+)", line)
        if m:
            out[m[1]] = int(m[2])
    return out


def totals(rows: list[dict], run: str) -> tuple[int, int]:
    """(cells passed, cells judged) of one run, summed over its table's cells."""
    passed = judged = 0
    for row in (r for r in rows if r["run"] == run):
        for value in row.values():
            if m := MARK.match(value):
                passed, judged = passed + int(m[1]), judged + int(m[2])
    return passed, judged


def row(rows: list[dict], run: str, shape: str) -> dict:
    (found,) = [r for r in rows if r["run"] == run and r["shape"] == shape]
    return found


def test_the_tables_show_the_pinned_verdict_counts(settings):
    meta = metadata(settings, SETS["matrix"], SETS["matrix_moe"])
    for name, runs in (("matrix", ("matrix1", "matrix2", "matrix3", "matrix4")), ("matrix_moe", ("moe1",))):
        rows = meta[name]["rows"]
        for run in runs:
            pin = pinned(run)
            assert pin and totals(rows, run) == (pin["pass"], sum(pin.values())), (name, run)
        assert meta[name]["verdicts"] == "; ".join(f"{r}: {v} x {n}" for r in runs for v, n in sorted(pinned(r).items()))
    assert meta["matrix_moe"]["answer"] == "60 cells judged: 14 fail, 46 pass"
    dense, moe = meta["matrix"]["rows"], meta["matrix_moe"]["rows"]
    # the README's rows: the non-64 vocabulary fails under overlay3 in matrix3 and passes in matrix4
    assert row(dense, "matrix3", "gpt2vocab-mha_l2")["overlay3 decode"] == "0/5 pass"
    assert row(dense, "matrix4", "gpt2vocab-mha_l2")["overlay3 decode"] == "5/5 pass"
    assert "first route flip" not in dense[0]  # a dense model records no routes
    qwen3 = row(moe, "moe1", "qwen3-30b-a3b_l2")
    assert (qwen3["stock decode"], qwen3["stock prefill"], qwen3["overlay3 decode"]) == ("1/5 pass", "5/5 pass", "5/5 pass")
    assert qwen3["first route flip"].startswith("stock decode c16: routing differs first at sequence 1 position 11, "
                                                "MoE layer 1")
    assert row(moe, "moe1", "mixtral-8x7b_l1")["first route flip"] == "routes identical in every failing cell"


def test_the_fp8_table_shows_the_pinned_verdict_counts(settings):
    meta = metadata(settings, SETS["matrix_fp8"])["matrix_fp8"]
    pin = pinned("fp8")
    assert pin and totals(meta["rows"], "fp8") == (pin["pass"], sum(pin.values()))
    assert meta["verdicts"] == "; ".join(f"fp8: {v} x {n}" for v, n in sorted(pin.items()))
    dense, moe = row(meta["rows"], "fp8", "llama3.2-1b_l4_fp8"), row(meta["rows"], "fp8", "qwen3-30b-a3b_l2_fp8")
    # the README's FP8 rows: overlay3 bitwise on the dense model, before and after the update; the MoE fails
    assert (dense["overlay3 decode"], dense["overlay3 prefill"], dense["stock prefill"]) == ("4/4 pass",) * 3
    assert dense["stock decode"] == "0/4 pass"
    assert {moe[c] for c in ("overlay3 decode", "overlay3 prefill", "stock decode", "stock prefill")} == {"0/3 pass"}


def test_the_block_fp8_table_shows_the_pinned_verdict_counts(settings):
    meta = metadata(settings, SETS["matrix_fp8b"])["matrix_fp8b"]
    pin = pinned("fp8b")
    assert pin == {"pass": 8} and totals(meta["rows"], "fp8b") == (8, 8)
    assert meta["verdicts"] == "fp8b: pass x 8" and meta["answer"] == "8 cells judged: 8 pass"
    # the README's block-FP8 row: overlay3 bitwise on every load, before and after the update; stock did not run
    (dense,) = meta["rows"]
    assert dense == {"run": "fp8b", "shape": "llama3.2-1b_l4_fp8b", "overlay3 decode": "4/4 pass",
                     "overlay3 prefill": "4/4 pass"}


def test_a_block_fp8_cell_with_one_logprob_changed_shows_failing(settings, tmp_path):
    receipts = shutil.copytree(unpacked(PROJECT_ROOT / SETS["matrix_fp8b"].receipts), tmp_path / "fp8b")
    perturb_arrays(receipts / "fp8b" / "mx-overlay3-llama3.2-1b_l4_fp8b-chunked-prefill", 1)  # resealed
    meta = metadata(settings, MatrixSet("planted", receipts, "the block-FP8 cell, one logprob off"))["planted"]
    assert row(meta["rows"], "fp8b", "llama3.2-1b_l4_fp8b")["overlay3 prefill"] == "3/4 pass"
    assert meta["verdicts"] == "fp8b: fail x 1; fp8b: pass x 7"


def test_the_cutlass_block_fp8_table_shows_the_pinned_verdict_counts(settings):
    meta = metadata(settings, SETS["matrix_fp8bc"])["matrix_fp8bc"]
    pin = pinned("fp8bc")
    assert pin == {"fail": 8, "pass": 24} and totals(meta["rows"], "fp8bc") == (24, 32)
    assert meta["verdicts"] == "fp8bc: fail x 8; fp8bc: pass x 24" and meta["answer"] == "32 cells judged: 8 fail, 24 pass"
    # the README's Cutlass-block rows: overlay3 bitwise on every load of both shapes, before and after the
    # update; stock passes prefill and fails every decode cell
    for shape in ("llama3.2-1b_l4_fp8bc", "qwen2.5-0.5b_l4_fp8bc"):
        got = row(meta["rows"], "fp8bc", shape)
        assert (got["overlay3 decode"], got["overlay3 prefill"], got["stock prefill"], got["stock decode"]) == (
            "4/4 pass", "4/4 pass", "4/4 pass", "0/4 pass"), shape


def test_a_cutlass_block_fp8_cell_with_one_logprob_changed_shows_failing(settings, tmp_path):
    receipts = shutil.copytree(unpacked(PROJECT_ROOT / SETS["matrix_fp8bc"].receipts), tmp_path / "fp8bc")
    perturb_arrays(receipts / "fp8bc" / "mx-overlay3-qwen2.5-0.5b_l4_fp8bc-chunked-prefill", 1)  # resealed
    meta = metadata(settings, MatrixSet("planted", receipts, "the Cutlass-block FP8 cells, one logprob off"))["planted"]
    assert row(meta["rows"], "fp8bc", "qwen2.5-0.5b_l4_fp8bc")["overlay3 prefill"] == "3/4 pass"
    assert row(meta["rows"], "fp8bc", "llama3.2-1b_l4_fp8bc")["overlay3 prefill"] == "4/4 pass"  # control
    assert meta["verdicts"] == "fp8bc: fail x 9; fp8bc: pass x 23"


def test_a_planted_route_flip_fails_its_cell_and_the_table_shows_it(settings, tmp_path):
    receipts = shutil.copytree(unpacked(PROJECT_ROOT / SETS["matrix_moe"].receipts), tmp_path / "moe")
    flip_route(receipts / "moe1" / "mx-overlay3-qwen3-30b-a3b_l2-c1-prefill", 1)  # resealed: only the judge can tell
    meta = metadata(settings, MatrixSet("planted", receipts, "the MoE matrix, one route flipped"))["planted"]
    qwen3 = row(meta["rows"], "moe1", "qwen3-30b-a3b_l2")
    assert qwen3["overlay3 prefill"] == "4/5 pass"
    assert qwen3["first route flip"].startswith("overlay3 prefill c1: routing differs first at sequence 0 position 5")
    assert meta["verdicts"] == "moe1: fail x 15; moe1: pass x 45"


def test_a_cell_whose_seal_is_broken_is_not_a_pass(settings, tmp_path):
    receipts = shutil.copytree(unpacked(PROJECT_ROOT / SETS["matrix_moe"].receipts), tmp_path / "moe")
    metrics = receipts / "moe1" / "mx-overlay3-mixtral-8x7b_l1-c16-decode" / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + "\n")  # one byte more, not resealed
    meta = metadata(settings, MatrixSet("tampered", receipts, "the MoE matrix, one seal broken"))["tampered"]
    assert row(meta["rows"], "moe1", "mixtral-8x7b_l1")["overlay3 decode"] == "4/5 pass (1 inconclusive)"


def test_missing_receipts_are_not_run_and_show_no_table(settings, tmp_path):
    gone = MatrixSet("gone", Path("tests/fixtures/h200/matrix_gone.tar.xz"), "nothing")
    meta = metadata(settings, gone)["gone"]
    assert meta["rows"] is None and meta["verdicts"] == "not run"
    assert meta["answer"] == "not run: tests/fixtures/h200/matrix_gone.tar.xz: <file>: no such archive"


def test_the_graph_has_the_matrix_where_the_questions_folder_holds_its_question(settings, tmp_path):
    graph = build_defs(settings).resolve_asset_graph()
    assert {matrix_key(m.name) for m in MATRIX_SETS} <= set(graph.get_all_asset_keys())
    assert build_defs(settings).resolve_job_def(MATRIX_JOB) is not None
    (tmp_path / "questions").mkdir()
    bare = Settings(candidates_dir=settings.candidates_dir, questions_dir=tmp_path / "questions",
                    ledger_path=settings.ledger_path, data_dir=settings.data_dir)
    assert not matrix_defs(bare).assets
