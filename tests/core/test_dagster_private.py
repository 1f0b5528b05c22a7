"""Dagster's private namespace (`dagster._…`) is imported by one module only,
resources/dagster_compat.py; every other product module uses Dagster's public names."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("tica", "tica_assets", "resources", "sensors")
COMPAT = "resources/dagster_compat.py"


def _private_imports(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] if node.module.startswith("dagster._") else []
            if node.module == "dagster":
                names += [f"dagster.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names if a.name.startswith("dagster._")]
    return names


def test_only_the_compat_module_imports_private_dagster_names():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel != COMPAT:
                found += [f"{rel}: {name}" for name in _private_imports(ast.parse(path.read_text()))]
    assert found == []


def test_the_scan_sees_a_private_import_and_the_compat_module_has_one():
    tree = ast.parse("import dagster._core.errors\nfrom dagster._core.pipes.utils import x\nfrom dagster import _y\n")
    assert _private_imports(tree) == ["dagster._core.errors", "dagster._core.pipes.utils", "dagster._y"]
    assert _private_imports(ast.parse((ROOT / COMPAT).read_text()))
