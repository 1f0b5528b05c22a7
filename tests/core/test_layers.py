"""The layers hold (pyproject.toml's [tool.importlinter] contracts, checked by import-linter over
every import statement, those inside functions included): the core imports no Dagster, resources
sit under assets and sensors, judging runs nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = str(Path(sys.executable).parent / "lint-imports")


def _lint(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LINT, "--no-cache", *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(cwd)})


def test_the_projects_import_contracts_are_kept():
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "3 kept, 0 broken" in out.stdout


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
