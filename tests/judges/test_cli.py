"""`tica judge ITEM --question Q LEG...`: the cell as JSON, or the cell and its tables."""

from __future__ import annotations

import io
import json

from tica.judges import cli_judge
from tica.verdict import VerdictCell

from .conftest import FIXTURES


def _run(argv):
    out = io.StringIO()
    rc = cli_judge(argv, out=out)
    return rc, out.getvalue()


def test_json_output_is_a_verdict_cell():
    rc, text = _run(["throughput", "--question", str(FIXTURES / "questions" / "throughput.yaml"),
                     "--receipts", str(FIXTURES / "throughput"), "--json"])
    cell = VerdictCell.model_validate_json(text)
    # no --manifest: bound to no candidate, so never a pass (tests/core/test_cli.py binds one); the
    # committed question freezes no statistical basis either, which the cell says too
    assert rc == 2 and cell.verdict.value == "inconclusive" and cell.numbers["formula_label"]
    assert any("bound to no candidate" in r for r in cell.reasons), cell.reasons
    assert any("no reviewed statistical basis" in r for r in cell.reasons), cell.reasons


def test_human_output_prints_the_tables():
    rc, text = _run(["quality", "-q", str(FIXTURES / "questions" / "quality.yaml"), str(FIXTURES / "quality")])
    assert rc == 2 and "## pairing (2x2)" in text and "| BI=1 correct |" in text


def test_exit_code_follows_the_verdict(receipts):
    from tica.canaries import process_exit
    legs = receipts("clean_exit")
    process_exit("client", exit_code=1)(None, legs)
    rc, _ = _run(["exit", "-q", str(FIXTURES / "questions" / "clean_exit.yaml"), *map(str, legs)])
    assert rc == 1


def test_recipe_is_judged_without_a_question():
    rc, text = _run(["recipe", str(FIXTURES / "recipe" / "recipe_dry_runs.json"), "--json"])
    assert rc == 0 and json.loads(text)["verdict"] == "pass"


def test_a_bad_question_file_is_an_input_error_naming_it(tmp_path):
    bad = tmp_path / "q.yaml"
    bad.write_text("name: x\n")
    rc, text = _run(["forward", "-q", str(bad), str(FIXTURES / "forward"), "--json"])
    assert rc == 4 and json.loads(text)["error"]["file"].endswith("q.yaml")
