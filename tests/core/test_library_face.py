"""The library face (`tica/__init__.py`): each name is the function the `tica` command calls,
imported on first use, and gives a script the answer the command gives."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import tica
from tica.cli import main

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "receipts"
HEAVY = ("duckdb", "pydantic", "torch", "scipy", "numpy")


def _imported_after(code: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after running `code`."""
    probe = f"import json, sys; {code}; print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    return json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                     check=True).stdout)


def test_import_tica_stays_light():
    assert _imported_after("import tica") == []
    assert "duckdb" in _imported_after("import tica; tica.open_ledger")  # negative control: a name imports its module


@pytest.mark.parametrize("name", [n for n in tica.__all__ if n != "__version__"])
def test_each_name_is_the_function_its_module_defines(name):
    module = importlib.import_module(tica._FACE[name])
    assert getattr(tica, name) is getattr(module, name)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'judgement'"):
        tica.judgement  # noqa: B018


def test_open_ledger_and_report(tmp_path):
    ledger = tica.open_ledger(tmp_path / "l.duckdb", create=True)
    assert ledger.verify().ok
    rep = tica.report(ledger, "cpu-tiny", None)
    assert not rep.accepted and rep.candidate_id is None


def test_judge_gives_the_cell_tica_judge_prints(candidate_dir, manifest_data, capsys):
    from tests.core.test_cli import _bound_forward

    manifest, question, legs = _bound_forward(candidate_dir, manifest_data)
    cell = tica.judge("forward", tica.load_question(question), tica.expand_receipts([legs]),
                      tica.load_candidate(manifest))
    assert main(["judge", "forward", "-q", str(question), "-m", str(manifest), "-r", str(legs), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (cell.verdict.value, cell.summary, list(cell.reasons)) == ("pass", printed["summary"], printed["reasons"])
    unbound = tica.judge("forward", tica.load_question(question), tica.expand_receipts([legs]), None)
    assert unbound.verdict.value == "inconclusive"  # negative control: bound to no candidate


def test_plan_quality_gives_the_plan_tica_plan_prints(tmp_path, capsys):
    question = FIX / "questions" / "quality.yaml"
    plan = tica.plan_quality(tica.load_question(question), tica.expand_receipts([FIX / "quality"]), 0.05, 0.8)
    assert main(["plan", "quality", str(FIX / "quality"), "-q", str(question), "--out", str(tmp_path / "d.yaml"),
                 "--json"]) == 0
    assert json.loads(json.dumps(plan.to_json())) == json.loads(capsys.readouterr().out)["plan"]


def test_plan_throughput_plans_a_pilot(tmp_path):
    from tests.stats.pilots import throughput_question, write_pilot

    question = throughput_question(4)
    legs = write_pilot(question, tmp_path / "pilot", {c: [0.02, 0.03, 0.025, 0.035] for c in
                                                      question.criteria.concurrencies})
    plan = tica.plan_throughput(question, tica.read_pilot(question, legs),
                                {c: 0.10 for c in question.criteria.concurrencies}, 0.05, 0.8)
    assert plan.rounds is not None and plan.rounds >= 2
