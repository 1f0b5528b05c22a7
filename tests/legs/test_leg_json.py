"""`--json` on `tica leg run` and `tica leg ingest`: one JSON object on stdout and nothing else;
the error on stderr too, with the documented exit codes (0 sealed, 1 sealed but not clean, 4 bad
input); bad input under --json is the `{"error": {file, field, message, line}}` that `tica judge`
and `tica plan` print."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tica.cli import main

PY = sys.executable
SAYS = "print('the command speaks')"


def _history(tmp: Path) -> Path:
    p = tmp / "history.jsonl"
    p.write_text("".join(json.dumps({"_step": s, "training/rollout_probs_diff_max": 0.0}) + "\n" for s in (1, 2)))
    return p


def test_leg_run_json_is_the_only_stdout_and_the_commands_output_goes_to_stderr(tmp_path, capsys):
    rc = main(["leg", "run", "--out", str(tmp_path / "leg"), "--item", "quality", "--arm", "bi1", "--json",
               "--", PY, "-c", SAYS])
    out, err = capsys.readouterr()
    report = json.loads(out)  # the whole of stdout is one object
    assert rc == report["exit"] == 0 and report["sealed"] and report["errors"] == []
    assert (report["leg"], report["item"], report["arm"]) == (str(tmp_path / "leg"), "quality", "bi1")
    assert [p["exit_code"] for p in report["processes"]] == [0]
    assert "the command speaks" in err
    rc = main(["leg", "run", "--out", str(tmp_path / "leg2"), "--item", "quality", "--arm", "bi1",
               "--", PY, "-c", SAYS])
    assert rc == 0 and "the command speaks" in capsys.readouterr().out  # control: without --json, stdout


def test_leg_run_json_records_a_failed_command_with_exit_1(tmp_path, capsys):
    rc = main(["leg", "run", "--out", str(tmp_path / "leg"), "--item", "quality", "--arm", "bi0", "--json",
               "--", PY, "-c", "raise SystemExit(3)"])
    report = json.loads(capsys.readouterr().out)
    assert rc == report["exit"] == 1 and any("exit code 3" in e for e in report["errors"])


def test_leg_run_json_bad_input_is_an_error_object_and_exit_4(tmp_path, capsys):
    rc = main(["leg", "run", "--out", str(tmp_path / "leg"), "--item", "quality", "--arm", "bi1", "--json",
               "--env", "NO_EQUALS", "--", PY, "-c", SAYS])
    out, err = capsys.readouterr()
    assert rc == 4 and json.loads(out)["error"]["field"] == "--env"
    assert "tica: error:" in err and "NO_EQUALS" in err and not (tmp_path / "leg").exists()


def test_leg_ingest_json_names_the_leg_and_what_it_leaves_unknown(tmp_path, capsys):
    src = _history(tmp_path)
    assert main(["leg", "ingest", "verl-wandb", str(src), "--out", str(tmp_path / "a"), "--arm", "bi1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["leg"], report["item"], report["arm"], report["sealed"], report["exit"]) == \
        (str(tmp_path / "a"), "forward", "bi1", True, 0)
    assert report["unknown"] == ["producer_version", "step_basis", "checkpoint_version"]
    assert main(["leg", "ingest", "verl-wandb", str(src), "--out", str(tmp_path / "b"), "--arm", "bi1", "--json",
                 "--producer-version", "0.5.0"]) == 0
    assert "producer_version" not in json.loads(capsys.readouterr().out)["unknown"]  # control: given, known


def test_leg_ingest_bad_input_prints_nothing_on_stdout_without_json(tmp_path, capsys):
    missing = tmp_path / "none.jsonl"
    assert main(["leg", "ingest", "verl-wandb", str(missing), "--out", str(tmp_path / "a"), "--arm", "bi1"]) == 4
    out, err = capsys.readouterr()
    assert out == "" and f"{missing}: <file>: no such file" in err
    assert main(["leg", "ingest", "verl-wandb", str(missing), "--out", str(tmp_path / "a"), "--arm", "bi1",
                 "--json"]) == 4
    assert json.loads(capsys.readouterr().out)["error"] == {"file": str(missing), "field": "<file>",
                                                            "message": "no such file", "line": None}
