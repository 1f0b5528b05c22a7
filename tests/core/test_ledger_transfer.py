"""`tica ledger export` / `import` move a chain between ledgers with every hash preserved, and
refuse anything that is not that chain whole (tica/ledger/transfer.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tica.cli import main
from tica.ledger import TABLES, Ledger


def _filled(path: Path) -> Ledger:
    ledger = Ledger(path)
    ledger.append("questions", {"question_hash": "sha256:q", "name": "q", "item": "forward", "body_json": {"a": [1, "é"]}})
    ledger.append_many([("verdicts", {"verdict_id": f"v{i}", "item": "forward", "verdict": "fail", "summary": "line\nbreak"})
                        for i in range(3)] + [("legs", {"leg_id": "l1", "round": 2, "slot": 1, "concurrency": None})])
    return ledger


def _tables(ledger: Ledger) -> dict[str, list[tuple]]:
    return {t: ledger.query(f"SELECT * FROM {t} ORDER BY seq")[1] for t in TABLES}


def _export(tmp_path: Path) -> tuple[Ledger, Path]:
    source = _filled(tmp_path / "a.duckdb")
    out = tmp_path / "chain.jsonl"
    assert main(["--ledger", str(source.path), "ledger", "export", "--out", str(out)]) == 0
    return source, out


def test_an_exported_chain_imports_row_for_row_with_every_hash(tmp_path):
    source, out = _export(tmp_path)
    target = Ledger(tmp_path / "b.duckdb")
    assert main(["--ledger", str(target.path), "ledger", "import", str(out)]) == 0
    assert _tables(target) == _tables(source)
    assert target.verify().head == source.verify().head
    # and the moved chain keeps growing as a chain
    target.append("reruns", {"rerun_id": "r1", "reason": "after the move"})
    assert target.verify().ok and target.verify().rows == source.verify().rows + 1


def _edited(out: Path, n: int, edit) -> Path:
    lines = out.read_text().splitlines()
    row = json.loads(lines[n])
    edit(row)
    lines[n] = json.dumps(row)
    out.write_text("\n".join(lines) + "\n")
    return out


@pytest.mark.parametrize("edit,field", [
    (lambda r: r["payload"].update(summary="rewritten"), "row_hash"),
    (lambda r: r.update(seq=9), "seq"),
    (lambda r: r.update(prev_hash="0" * 64), "prev_hash"),
    (lambda r: r.update(table="nope"), "table"),
    (lambda r: r["payload"].update(extra=1), "payload"),
])
def test_an_edited_export_is_refused_naming_line_and_field_and_nothing_is_written(tmp_path, capsys, edit, field):
    _, out = _export(tmp_path)
    _edited(out, 2, edit)
    target = tmp_path / "b.duckdb"
    assert main(["--ledger", str(target), "ledger", "import", str(out)]) == 4
    err = capsys.readouterr().err
    assert f"{out}: {field}" in err and "(line 3)" in err
    assert not target.exists() or Ledger(target).verify().rows == 0


def test_a_truncated_export_is_refused(tmp_path, capsys):
    _, out = _export(tmp_path)
    out.write_text("\n".join(out.read_text().splitlines()[:-1]) + "\n")
    assert main(["--ledger", str(tmp_path / "b.duckdb"), "ledger", "import", str(out)]) == 4
    assert "truncated" in capsys.readouterr().err


def test_a_chain_is_never_merged_into_a_ledger_that_holds_rows(tmp_path, capsys):
    _, out = _export(tmp_path)
    other = _filled(tmp_path / "c.duckdb")
    before = _tables(other)
    assert main(["--ledger", str(other.path), "ledger", "import", str(out)]) == 4
    assert "never merged" in capsys.readouterr().err
    assert _tables(other) == before


def test_a_ledger_that_does_not_verify_is_not_exported(tmp_path):
    import duckdb

    source = _filled(tmp_path / "a.duckdb")
    with duckdb.connect(str(source.path)) as con:
        con.execute("UPDATE verdicts SET summary = 'edited' WHERE verdict_id = 'v1'")
    out = tmp_path / "chain.jsonl"
    assert main(["--ledger", str(source.path), "ledger", "export", "--out", str(out)]) == 1
    assert not out.exists()
