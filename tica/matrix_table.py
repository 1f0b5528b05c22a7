"""A committed shape and load matrix replayed through its judge (`tica.judges.matrix`) and shown as
one table: a row per (run, shape), a column per (candidate, scoring), each cell "k/n pass" over the
cells of that column (every load, and the cells scored after the update, which are scored decode or
prefill too). A MoE row whose cells fail adds the first route flip the judge named.

Nothing here judges: every verdict is `matrix_cells`'. A receipt set that cannot be read is not run,
never a table of passes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tica.errors import InputError
from tica.judges.matrix import MatrixCell, matrix_cells
from tica.messages import relative, sentence
from tica.question import load_question
from tica.receipt_archive import is_archive, unpacked
from tica.verdict import Verdict

RUN = "run"
SHAPE = "shape"
ROUTING = "first route flip"


class MatrixReplay(BaseModel):
    """The judged cells of one receipt set, or why none were judged (`not_run`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cells: tuple[MatrixCell, ...] = ()
    not_run: str | None = None


class ShapeTable(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    columns: tuple[str, ...]  # RUN, SHAPE, one per (candidate, scoring), then ROUTING where any cell has routes
    rows: tuple[dict[str, str], ...]


def replay_matrix(question: Path, receipts: Path, cache: Path | None = None) -> MatrixReplay:
    """Judge every matrix cell under `receipts` (a folder, or an archive unpacked once into `cache`)
    under the frozen `question`; an unreadable question or receipt set is not run, with its reason."""
    try:
        q = load_question(question)
        root = unpacked(receipts, cache) if is_archive(receipts) else receipts
        if not root.is_dir():
            raise InputError(receipts, "<folder>", "no such folder of receipts")
        cells = matrix_cells(q, root)
    except InputError as err:
        return MatrixReplay(not_run=f"not run: {sentence(relative(str(err)), 240)}")
    if not cells:
        return MatrixReplay(not_run=f"not run: {relative(str(receipts))} holds no matrix cell")
    return MatrixReplay(cells=tuple(cells))


def scoring(cell: MatrixCell) -> str:
    """decode or prefill: a cell scored after the update counts in its scoring's column."""
    return cell.scored.removesuffix("_post_update")


def column(cell: MatrixCell) -> str:
    return f"{cell.candidate} {scoring(cell)}"


def _mark(cells: Sequence[MatrixCell]) -> str:
    passed = sum(c.verdict is Verdict.PASS for c in cells)
    other = Counter(c.verdict.value for c in cells if c.verdict not in (Verdict.PASS, Verdict.FAIL))
    extra = ", ".join(f"{n} {v}" for v, n in sorted(other.items()))
    return f"{passed}/{len(cells)} pass" + (f" ({extra})" if extra else "")


def _route_note(cells: Sequence[MatrixCell]) -> str:
    """The first failing cell's first route flip (its column and load), or that every failing cell
    with recorded routes kept them identical; empty where no failing cell recorded routes."""
    failed = [c for c in cells if c.verdict is Verdict.FAIL and c.routing is not None]
    for c in failed:
        if c.routing and not c.routing.startswith("routing identical"):
            return f"{column(c)} {c.load}: {c.routing.split('; ')[0]}"
    return "routes identical in every failing cell" if failed else ""


def shape_table(cells: Iterable[MatrixCell]) -> ShapeTable:
    cells = list(cells)
    names = [f"{candidate} {kind}" for candidate, kind in sorted({(c.candidate, scoring(c)) for c in cells})]
    routed = any(c.routing is not None for c in cells)
    rows: dict[tuple[str, str], list[MatrixCell]] = {}
    for c in cells:
        rows.setdefault((c.run, c.shape), []).append(c)
    out = []
    for (run, shape), mine in sorted(rows.items()):
        row = {RUN: run, SHAPE: shape}
        for name in names:
            got = [c for c in mine if column(c) == name]
            row[name] = _mark(got) if got else "—"
        if routed:
            row[ROUTING] = _route_note(mine) or "—"
        out.append(row)
    return ShapeTable(columns=(RUN, SHAPE, *names, *((ROUTING,) if routed else ())), rows=tuple(out))


def table_markdown(table: ShapeTable) -> str:
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(row[c] for c in table.columns) + " |" for row in table.rows]
    return "\n".join(lines)


def verdict_counts(cells: Iterable[MatrixCell]) -> list[str]:
    """`<run>: <verdict> x <n>`, as `scripts/committed_verdicts.py` pins them."""
    counts = Counter((c.run, c.verdict.value) for c in cells)
    return [f"{run}: {verdict} x {n}" for (run, verdict), n in sorted(counts.items())]
