"""The `tica` entry point: `judge` hands over to the judges' own CLI and its exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from tica.cli import main
from tica.evidence import EvidenceItem

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "receipts"


def _bound_forward(candidate_dir: Path, manifest_data: dict) -> tuple[Path, Path, Path]:
    from tests.bound_receipts import build_bound
    from tica.judges import load_candidate
    from tica.question import load_question

    from .conftest import write_manifest

    manifest = write_manifest(candidate_dir, manifest_data)
    question = FIX / "questions" / "forward.yaml"
    legs = candidate_dir / "legs"
    build_bound(EvidenceItem.FORWARD, load_question(question), load_candidate(manifest), legs)
    return manifest, question, legs


def test_tica_judge_passes_receipts_bound_to_the_manifest(candidate_dir, manifest_data, capsys):
    manifest, question, legs = _bound_forward(candidate_dir, manifest_data)
    rc = main(["judge", "forward", "-q", str(question), "-m", str(manifest), "-r", str(legs), "--json"])
    cell = json.loads(capsys.readouterr().out)
    assert (rc, cell["verdict"], cell["item"]) == (0, "pass", "forward"), cell["reasons"]


def test_tica_judge_without_a_manifest_is_bound_to_no_candidate_and_cannot_pass(candidate_dir, manifest_data, capsys):
    _, question, legs = _bound_forward(candidate_dir, manifest_data)
    rc = main(["judge", "forward", "-q", str(question), "-r", str(legs), "--json"])
    cell = json.loads(capsys.readouterr().out)
    assert (rc, cell["verdict"]) == (2, "inconclusive")
    assert "bound to no candidate" in cell["reasons"][0]


def test_tica_judge_for_another_candidate_cannot_pass(candidate_dir, manifest_data, capsys):
    manifest, question, legs = _bound_forward(candidate_dir, manifest_data)
    (candidate_dir / "ckpt" / "model.safetensors").write_bytes(b"other weights" * 64)
    rc = main(["judge", "forward", "-q", str(question), "-m", str(manifest), "-r", str(legs), "--json"])
    cell = json.loads(capsys.readouterr().out)
    assert rc == 2 and cell["verdict"] == "inconclusive"
    assert any("weights" in r and "another candidate" in r for r in cell["reasons"]), cell["reasons"]


def test_tica_judge_exit_code_is_not_zero_for_a_tampered_leg(tmp_path, capsys):
    import shutil

    legs = shutil.copytree(FIX / "forward", tmp_path / "forward")
    metrics = next(legs.rglob("metrics.jsonl"))
    metrics.write_text(metrics.read_text().replace('"step": 1', '"step": 1 ', 1))
    rc = main(["judge", "forward", "-q", str(FIX / "questions" / "forward.yaml"), "-r", str(legs), "--json"])
    error = json.loads(capsys.readouterr().out)["error"]  # a receipt that fails its seal is bad input: exit 4
    assert rc == 4 and "seal.json" in error["file"] and "changed after sealing" in error["message"]


def test_tica_judge_refuses_a_leg_folder_without_leg_json_instead_of_skipping_it(tmp_path, capsys):
    import shutil

    legs = shutil.copytree(FIX / "forward", tmp_path / "forward")
    failing = next(p for p in legs.iterdir() if p.is_dir())
    (failing / "leg.json").unlink()
    rc = main(["judge", "forward", "-q", str(FIX / "questions" / "forward.yaml"), "-r", str(legs), "--json"])
    error = json.loads(capsys.readouterr().out)["error"]
    assert rc == 4 and error["file"] == str(failing) and "without leg.json" in error["message"]


def test_the_cli_module_imports_nothing_heavy():
    """`tica --help` and usage errors must stay fast (benchmarks/cli_startup.py): each verb imports
    what it uses."""
    import subprocess
    import sys

    probe = ("import sys, {m}; print(sorted(x for x in ('duckdb', 'pydantic', 'torch', 'scipy', 'numpy') "
             "if x in sys.modules))")
    run = lambda m: subprocess.run([sys.executable, "-c", probe.format(m=m)], capture_output=True,  # noqa: E731
                                   text=True, check=True).stdout.strip()
    assert run("tica.cli") == "[]"
    assert "duckdb" in run("tica.ledger")  # negative control: the probe sees a heavy import


FINGERPRINT_PROBE = """
import contextlib, io, json, sys
from tica.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    main({argv})
print(json.dumps(sorted(m for m in ("duckdb", "numpy", "torch", "tica.leg_run", "tica.ledger") if m in sys.modules)))
"""


def test_a_fingerprint_imports_neither_the_ledger_nor_the_leg_runner(tmp_path):
    """`tica candidate fingerprint` is run before every materialization and by scripts that compare
    trees: its start-up is its cost on an unchanged tree (benchmarks/fingerprint_startup.py)."""
    import subprocess
    import sys

    run = lambda argv: json.loads(subprocess.run([sys.executable, "-c", FINGERPRINT_PROBE.format(argv=argv)],  # noqa: E731
                                                 capture_output=True, text=True, check=True).stdout)
    assert run(["candidate", "fingerprint", str(tmp_path / "absent.yaml")]) == []
    # negative control: a verb that opens the ledger is seen importing it
    assert "tica.ledger" in run(["--ledger", str(tmp_path / "absent.duckdb"), "ledger", "head"])


HELP_PROBE = """
import contextlib, io, json, sys
from tica.cli import build_parser, main, walk
for path, _ in walk(build_parser()):
    if path in {skip}:
        continue
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main([*path, "--help"])
print(json.dumps(sorted(m for m in ("duckdb", "pydantic", "torch", "scipy", "numpy") if m in sys.modules)))
"""


def test_every_verb_help_imports_nothing_heavy():
    """`tica --help` and `tica <verb> --help`, run through `main`, import neither DuckDB nor pydantic
    nor torch: each verb module imports what its handler uses. `tica ledger query --help` (it lists
    the views) and `tica judge --help` (the judges' own exit codes) read the heavy modules on purpose."""
    import subprocess
    import sys

    run = lambda skip: json.loads(subprocess.run([sys.executable, "-c", HELP_PROBE.format(skip=skip)],  # noqa: E731
                                                 capture_output=True, text=True, check=True).stdout)
    assert run({("ledger", "query"), ("judge",)}) == []
    assert "duckdb" in run(set())  # negative control: the probe sees the views' import


def test_python_m_tica_cli_is_the_tica_command():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "tica.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("usage: tica ")
    bad = subprocess.run([sys.executable, "-m", "tica.cli", "frobnicate"], capture_output=True, text=True)
    assert bad.returncode == 4 and "invalid choice" in bad.stderr


def test_every_core_verb_speaks_json(tmp_path, capsys):
    """--json on candidate, question and ledger verbs: the output parses, and names what the
    text output names."""
    import json as _json

    from tica.cli import main
    from tica.ledger import Ledger

    path = str(tmp_path / "l.duckdb")
    Ledger(path).init().append("reruns", {"rerun_id": "r", "original_kind": "leg", "original_id": "a",
                                          "new_id": "b", "reason": "t"})
    for argv, key in ((["ledger", "query", "SELECT rerun_id FROM reruns"], "rows"),
                      (["ledger", "verify"], "ok"), (["ledger", "head"], "row_hash")):
        assert main(["--ledger", path, *argv, "--json"]) == 0, argv
        assert key in _json.loads(capsys.readouterr().out), argv
    assert main(["--ledger", path, "ledger", "query", "SELECT 1", "--json"]) == 0
    assert _json.loads(capsys.readouterr().out)["rows"] == [[1]]
