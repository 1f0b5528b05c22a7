"""The layers hold (pyproject.toml's [tool.importlinter] contracts, checked by import-linter over
every import statement, those inside functions included): the core imports no Dagster, resources
sit under assets and sensors, judging runs nothing, the pairing imports nothing of the project,
no evidence item's room imports another or anything but the core, the core never imports its
command line, the ledger's modules import downwards only."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = str(Path(sys.executable).parent / "lint-imports")


def _lint(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LINT, "--no-cache", *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(cwd)})


def test_the_projects_import_contracts_are_kept():
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "10 kept, 0 broken" in out.stdout


def test_an_import_inside_a_function_breaks_a_contract(tmp_path):
    """Negative control: a core module that reaches a Dagster layer from inside a function (how the
    ledger's cycle hid from the earlier scan) is caught and named."""
    core, layer = tmp_path / "core", tmp_path / "layer"
    for pkg in (core, layer):
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
    (layer / "assets.py").write_text("X = 1\n")
    (core / "rules.py").write_text("def f():\n    from layer.assets import X\n    return X\n")
    (tmp_path / "contracts.toml").write_text(
        '[tool.importlinter]\nroot_packages = ["core", "layer"]\n\n[[tool.importlinter.contracts]]\n'
        'name = "core imports no layer"\ntype = "forbidden"\nsource_modules = ["core"]\nforbidden_modules = ["layer"]\n')
    out = _lint(tmp_path, "--config", "contracts.toml")
    assert out.returncode == 1, out.stdout
    assert "core imports no layer BROKEN" in out.stdout and "core.rules -> layer.assets" in out.stdout


def _ledger_contracts(*prefixes: str, external: bool = False) -> str:
    """The project's own ledger contracts (or those named so), as a configuration over the `tica`
    package alone (and, with `external`, the packages it imports)."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    lines = ["[tool.importlinter]", 'root_packages = ["tica"]']
    lines += ["include_external_packages = true"] if external else []
    for contract in contracts:
        if contract["name"].startswith(prefixes or ("the ledger's",)):
            lines += ["", "[[tool.importlinter.contracts]]", *(f"{k} = {json.dumps(v)}" for k, v in contract.items())]
    return "\n".join(lines) + "\n"


def _python_only(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if n == "__pycache__" or not (n.endswith(".py") or (Path(folder) / n).is_dir())]


@pytest.mark.parametrize("importer,imported,broken,named", [
    # the loop the flat modules made: reading batches on Postgres built a PostgresLedger for its connection
    ("batches", "from tica.ledger.postgres_store import PostgresLedger", "the ledger's modules import downwards only",
     "tica.ledger.batches -> tica.ledger.postgres_store (l."),
    # a loop through the package's __init__, which imports every module
    ("parallel", "from tica.ledger import Ledger", "the ledger's modules never import the package itself",
     "tica.ledger.parallel -> tica.ledger (l."),
])
def test_a_ledger_module_importing_upwards_breaks_a_contract(tmp_path, importer, imported, broken, named):
    """Negative controls, in a copy of `tica` under the project's ledger contracts: a module that
    imports upwards from inside a function is caught and named; the unchanged copy keeps them."""
    shutil.copytree(ROOT / "tica", tmp_path / "tica", ignore=_python_only)
    (tmp_path / "contracts.toml").write_text(_ledger_contracts())
    kept = _lint(tmp_path, "--config", "contracts.toml")
    assert kept.returncode == 0 and "2 kept, 0 broken" in kept.stdout, kept.stdout[-3000:] + kept.stderr[-2000:]
    module = tmp_path / "tica" / "ledger" / f"{importer}.py"
    module.write_text(module.read_text() + f"\n\ndef _upwards():\n    {imported}\n")
    out = _lint(tmp_path, "--config", "contracts.toml")
    assert out.returncode == 1, out.stdout
    assert f"{broken} BROKEN" in out.stdout and named in out.stdout, out.stdout[-3000:]


CLI_CONTRACTS = ("the core never imports its command line", "the library face never imports the command line")


@pytest.mark.parametrize("importer,broken,named", [
    ("tica/evidence.py", CLI_CONTRACTS[0], "tica.evidence -> tica.cli.report (l."),
    ("tica/__init__.py", CLI_CONTRACTS[1], "tica -> tica.cli.report (l."),
])
def test_the_core_importing_its_command_line_breaks_a_contract(tmp_path, importer, broken, named):
    """Negative controls, in a copy of `tica` under the project's CLI contracts: a core module, or the
    library face, that reaches a verb from inside a function is caught and named."""
    shutil.copytree(ROOT / "tica", tmp_path / "tica", ignore=_python_only)
    (tmp_path / "contracts.toml").write_text(_ledger_contracts(*CLI_CONTRACTS))
    kept = _lint(tmp_path, "--config", "contracts.toml")
    assert kept.returncode == 0 and "2 kept, 0 broken" in kept.stdout, kept.stdout[-3000:] + kept.stderr[-2000:]
    module = tmp_path / importer
    module.write_text(module.read_text() + "\n\ndef _upwards():\n    from tica.cli.report import report_text\n")
    out = _lint(tmp_path, "--config", "contracts.toml")
    assert out.returncode == 1, out.stdout
    assert f"{broken} BROKEN" in out.stdout and named in out.stdout, out.stdout[-3000:]


PAIRING_CONTRACT = "the pairing imports nothing of the project"


@pytest.mark.parametrize("imported,named", [
    ("from tica.evidence import EvidenceItem", "tica.pairing -> tica.evidence (l."),
    ("import yaml", "tica.pairing -> yaml (l."),
])
def test_the_pairing_importing_anything_breaks_its_contract(tmp_path, imported, named):
    """Negative controls, in a copy of `tica` under the project's pairing contract: the pairing module
    reaching the project or a third-party package from inside a function is caught and named."""
    shutil.copytree(ROOT / "tica", tmp_path / "tica", ignore=_python_only)
    (tmp_path / "contracts.toml").write_text(_ledger_contracts(PAIRING_CONTRACT, external=True))
    kept = _lint(tmp_path, "--config", "contracts.toml")
    assert kept.returncode == 0 and "1 kept, 0 broken" in kept.stdout, kept.stdout[-3000:] + kept.stderr[-2000:]
    module = tmp_path / "tica" / "pairing.py"
    module.write_text(module.read_text() + f"\n\ndef _reach():\n    {imported}\n")
    out = _lint(tmp_path, "--config", "contracts.toml")
    assert out.returncode == 1, out.stdout
    assert f"{PAIRING_CONTRACT} BROKEN" in out.stdout and named in out.stdout, out.stdout[-3000:]
