"""The `tica` entry point: `judge` hands over to the judges' own CLI and its exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from tica.cli import main

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "receipts"


def test_tica_judge_passes_the_sealed_passing_forward_set(capsys):
    rc = main(["judge", "forward", "-q", str(FIX / "questions" / "forward.yaml"), "-r", str(FIX / "forward"), "--json"])
    cell = json.loads(capsys.readouterr().out)
    assert (rc, cell["verdict"], cell["item"]) == (0, "pass", "forward")


def test_tica_judge_exit_code_is_not_zero_for_a_tampered_leg(tmp_path, capsys):
    import shutil

    legs = shutil.copytree(FIX / "forward", tmp_path / "forward")
    metrics = next(legs.rglob("metrics.jsonl"))
    metrics.write_text(metrics.read_text().replace('"step": 1', '"step": 1 ', 1))
    rc = main(["judge", "forward", "-q", str(FIX / "questions" / "forward.yaml"), "-r", str(legs), "--json"])
    assert rc != 0 and json.loads(capsys.readouterr().out)["verdict"] != "pass"
