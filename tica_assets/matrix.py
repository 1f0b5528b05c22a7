"""The shape and load matrix in the graph: one asset per committed matrix receipt set
(`h200-matrix/<set>`), replayed through the matrix judge under the question frozen before it
(`<questions>/h200-matrix/forward.yaml`), its table shown in the materialization's metadata.

Not a candidate track: the cells span candidates and shapes, so no manifest binds them and no
acceptance report reads them. Nothing in the ledger stores matrix cells; the verdicts live in the
metadata (and in `tests/fixtures/committed_verdicts.txt`, pinned).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dagster import (
    AssetKey,
    AssetSelection,
    Definitions,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableRecord,
    TableSchema,
    asset,
    define_asset_job,
)

from tica.matrix_table import ShapeTable, replay_matrix, shape_table, verdict_counts
from tica_assets.keys import safe_name
from tica_assets.settings import PROJECT_ROOT, Settings

MATRIX_TRACK = "h200-matrix"
MATRIX_JOB = safe_name(MATRIX_TRACK)
FIXTURES_DIR = Path("tests/fixtures/h200")


@dataclass(frozen=True)
class MatrixSet:
    name: str  # the asset's last key part
    receipts: Path  # an archive or a folder of runs; relative paths resolve against the project root
    shown: str  # what it replays, for the asset's description


MATRIX_SETS = (
    MatrixSet("matrix", FIXTURES_DIR / "matrix.tar.xz",
              "the dense matrix (runs matrix1-4): seeded models of 8 shapes, loads c1, c64, c320 and chunked, "
              "stock vLLM 0.26 and its overlays"),
    MatrixSet("matrix_moe", FIXTURES_DIR / "matrix_moe.tar.xz",
              "the MoE matrix (run moe1): three MoE geometries, loads c1, c16, c256s and chunked, "
              "stock and overlay3, routes compared per token and layer"),
    MatrixSet("matrix_packed", FIXTURES_DIR / "matrix_packed.tar.xz",
              "the packing limit (run matrix5): llama3.2-1b_l4 on load packed_limit, stock and overlay3"),
    MatrixSet("matrix_fp8", FIXTURES_DIR / "matrix_fp8.tar.xz",
              "the FP8 cells (run fp8): llama3.2-1b_l4 and qwen3-30b-a3b_l2 served with vLLM's online FP8, "
              "stock and overlay3"),
    MatrixSet("matrix_fp8b", FIXTURES_DIR / "matrix_fp8b.tar.xz",
              "the block-FP8 cell (run fp8b): llama3.2-1b_l4 served from a 128x128 block-FP8 checkpoint on "
              "vLLM's DeepGEMM linears, overlay3 only (stock and the Cutlass-block cell did not run)"),
    MatrixSet("matrix_fp8bc", FIXTURES_DIR / "matrix_fp8bc.tar.xz",
              "the block-FP8 cells with DeepGEMM off (run fp8bc): llama3.2-1b_l4 and qwen2.5-0.5b_l4 served from "
              "a 128x128 block-FP8 checkpoint on vLLM's Cutlass block linears, stock and overlay3"),
)


def matrix_key(name: str) -> AssetKey:
    return AssetKey([MATRIX_TRACK, name])


def matrix_question(settings: Settings) -> Path:
    return settings.questions_dir / MATRIX_TRACK / "forward.yaml"


def shown_table(table: ShapeTable) -> MetadataValue:
    schema = TableSchema(columns=[TableColumn(c, "string") for c in table.columns])
    return MetadataValue.table(records=[TableRecord(row) for row in table.rows], schema=schema)


def matrix_asset(matrix: MatrixSet, settings: Settings):
    @asset(
        key=matrix_key(matrix.name),
        description=f"Replays {matrix.shown} through the matrix judge; one row per run and shape, "
                    "k/n cells passed per candidate and scoring.",
        group_name=MATRIX_JOB,
    )
    def _matrix(context) -> MaterializeResult:
        receipts = matrix.receipts if matrix.receipts.is_absolute() else PROJECT_ROOT / matrix.receipts
        replay = replay_matrix(matrix_question(settings), receipts)
        if replay.not_run is not None:
            context.log.warning(replay.not_run)
            return MaterializeResult(metadata={"answer": MetadataValue.text(replay.not_run),
                                               "verdicts": MetadataValue.text("not run")})
        table = shape_table(replay.cells)
        counts = verdict_counts(replay.cells)
        by_verdict = Counter(c.verdict.value for c in replay.cells)
        answer = f"{len(replay.cells)} cells judged: " + ", ".join(f"{n} {v}" for v, n in sorted(by_verdict.items()))
        context.log.info(answer)
        return MaterializeResult(metadata={
            "answer": MetadataValue.text(answer),
            "table": shown_table(table),
            "verdicts": MetadataValue.text("; ".join(counts)),
        })

    return _matrix


def matrix_defs(settings: Settings, sets: Sequence[MatrixSet] = MATRIX_SETS) -> Definitions:
    """The matrix assets and their job, where the questions folder holds the matrix's question
    folder (a project without it has no matrix)."""
    if not (settings.questions_dir / MATRIX_TRACK).is_dir():
        return Definitions()
    assets = [matrix_asset(m, settings) for m in sets]
    job = define_asset_job(MATRIX_JOB, selection=AssetSelection.assets(*assets),
                           description="Replay every committed matrix receipt set through the matrix judge.")
    return Definitions(assets=assets, jobs=[job])
