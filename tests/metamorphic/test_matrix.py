"""Metamorphic relations over the shape/load matrix (the committed H200 cells of one run, two
models, both candidates): a cell is its content, never its folder's name.

MX1 relabel: a cell's leg replaced by another cell's (differing in one part of the name:
    candidate, shape, load or scored) never makes the relabelled cell pass.
MX2 duplicate: a passing cell copied under a name no cell has never passes there.
MX3 unknown: a name part the leg no longer records (a placeholder, or deleted) never passes.
MX4 removal: removing a cell never raises another cell's verdict.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from tica.canaries import edit_jsonl, edit_meta
from tica.judges.matrix import LEG_RE, matrix_cells
from tica.question import load_question
from tica.receipt_archive import unpacked
from tica.verdict import Verdict

from .conftest import HYP

ROOT = Path(__file__).resolve().parents[2]
ARCHIVE = ROOT / "tests" / "fixtures" / "h200" / "matrix.tar.xz"
QUESTION = load_question(ROOT / "demo" / "questions" / "h200-matrix" / "forward.yaml")
RUN = "matrix2"
MODELS = ("smollm2-135m_l16", "qwen2.5-0.5b_l4")
PARTS = ("candidate", "shape", "load", "scored")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """One run's cells of two models, both candidates (60 cells: 37 pass, 23 fail)."""
    root = tmp_path_factory.mktemp("matrix") / "base"
    src = unpacked(ARCHIVE, tmp_path_factory.mktemp("receipts"))
    for leg in sorted((src / RUN).iterdir()):
        m = LEG_RE.match(leg.name)
        if m and not m["scored"].startswith("fault_") and m["shape"] in MODELS:
            shutil.copytree(leg, root / RUN / leg.name)
    return root


def verdicts(root: Path) -> dict[str, Verdict]:
    return {f"mx-{c.candidate}-{c.shape}-{c.load}-{c.scored}": c.verdict for c in matrix_cells(QUESTION, root)}


@pytest.fixture(scope="module")
def start(base) -> dict[str, Verdict]:
    v = verdicts(base)
    assert {Verdict.PASS, Verdict.FAIL} <= set(v.values()), v
    return v


def _copy(base: Path, tmp_path: Path) -> Path:
    root = tmp_path / "case"
    shutil.copytree(base, root)
    return root


def _name(parts: dict[str, str]) -> str:
    return f"mx-{parts['candidate']}-{parts['shape']}-{parts['load']}-{parts['scored']}"


def _parts(name: str) -> dict[str, str]:
    m = LEG_RE.match(name)
    return {p: m[p] for p in PARTS}


def relabel_pairs(start: dict[str, Verdict]) -> list[tuple[str, str, str]]:
    """(failing cell, passing cell, the one name part they differ in), one per part and cell."""
    out = []
    for f, fv in start.items():
        if fv is Verdict.PASS:
            continue
        for part in PARTS:
            same = [p for p, pv in start.items() if pv is Verdict.PASS and
                    [k for k in PARTS if _parts(p)[k] != _parts(f)[k]] == [part]]
            if same:
                out.append((f, same[0], part))
    return out


def test_mx1_a_cell_relabelled_from_a_passing_one_never_passes(base, start, tmp_path):
    pairs = relabel_pairs(start)
    assert {part for _, _, part in pairs} >= {"candidate", "load", "scored"}, pairs  # the family spans the name
    violations = []
    for failing, passing, part in pairs:
        root = _copy(base, tmp_path / f"{failing}-{part}")
        shutil.rmtree(root / RUN / failing)
        shutil.copytree(root / RUN / passing, root / RUN / failing)
        got = verdicts(root)[failing]
        if got is Verdict.PASS:
            violations.append(f"{failing} <- {passing} ({part} relabelled): PASS")
    assert not violations, violations


@pytest.mark.parametrize("part,value", [("load", "c999"), ("shape", "other-shape_l2"), ("candidate", "overlay9"),
                                        ("scored", "prefill_post_update")])
def test_mx2_a_passing_cell_copied_under_a_name_no_cell_has_never_passes_there(base, start, tmp_path, part, value):
    passing = next(n for n, v in start.items() if v is Verdict.PASS and _parts(n)[part] != value)
    new = _name({**_parts(passing), part: value})
    if new in start:
        pytest.skip(f"{new} is a cell of the set")
    root = _copy(base, tmp_path)
    shutil.copytree(root / RUN / passing, root / RUN / new)
    got = verdicts(root)
    assert got[new] is not Verdict.PASS, new
    assert got[passing] is Verdict.PASS  # control: the original still passes


def _unrecord(key: str, how: str):
    def edit(leg: Path) -> None:
        if key.startswith("tica/"):
            edit_jsonl(leg / "metrics.jsonl", lambda rows: [r.pop(key, None) if how == "delete" else r.update({key: how})
                                                             for r in rows], leg)
        else:
            edit_meta(leg, lambda m: m["resolved_config"].pop(key, None) if how == "delete"
                      else m["resolved_config"].update({key: how}))
    return edit


UNRECORD = [("model_shape", "delete"), ("model_shape", "unknown"), ("candidate", "n/a"), ("candidate", "delete")]


@pytest.mark.parametrize("key,how", UNRECORD)
def test_mx3_a_name_part_the_leg_does_not_record_never_passes(base, start, tmp_path, key, how):
    passing = next(n for n, v in start.items() if v is Verdict.PASS)
    root = _copy(base, tmp_path)
    _unrecord(key, how)(root / RUN / passing)
    assert verdicts(root)[passing] is not Verdict.PASS


@HYP
@given(data=st.data())
def test_mx4_removing_a_cell_never_raises_another(base, start, tmp_path_factory, data):
    gone = data.draw(st.sampled_from(sorted(start)), label="removed")
    note(gone)
    root = _copy(base, tmp_path_factory.mktemp("mx4"))
    shutil.rmtree(root / RUN / gone)
    after = verdicts(root)
    raised = [n for n, v in after.items() if v is Verdict.PASS and start[n] is not Verdict.PASS]
    assert not raised and gone not in after, raised
