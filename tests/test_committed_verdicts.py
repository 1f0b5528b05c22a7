"""Every committed receipt set keeps its verdict unless CHANGELOG.md says why it moved: the verdict
of each set (scripts/committed_verdicts.py) against the snapshot committed beside the fixtures.
A change of judge that moves one fails here; regenerate the snapshot with the script and name the
move in CHANGELOG.md."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = ROOT / "tests" / "fixtures" / "committed_verdicts.txt"


def _script():
    spec = importlib.util.spec_from_file_location("committed_verdicts", ROOT / "scripts" / "committed_verdicts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_no_committed_verdict_moves_without_a_changelog_entry(tmp_path, monkeypatch):
    monkeypatch.setenv("TICA_CACHE_DIR", str(tmp_path / "cache"))
    now = _script().verdict_lines()
    before = SNAPSHOT.read_text().splitlines()
    verdicts = lambda lines: [l.split(" | ", 1)[0] for l in lines]  # noqa: E731
    assert verdicts(now) == verdicts(before), "a committed verdict moved: say why in CHANGELOG.md, then regenerate"
    assert now == before, "a committed verdict's summary changed: regenerate tests/fixtures/committed_verdicts.txt"
