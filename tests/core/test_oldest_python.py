"""Every Python file of the project parses on the oldest Python it claims (pyproject's
requires-python): a benchmark once used 3.12's nested-quote f-strings while the project says 3.11."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OLDEST = tuple(int(p) for p in re.fullmatch(r">=\s*(\d+)\.(\d+)",
               tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]).groups())
# the parser is the running interpreter's: only on the oldest Python does it refuse newer syntax
ON_OLDEST = pytest.mark.skipif(sys.version_info[:2] != OLDEST, reason=f"runs on Python {OLDEST[0]}.{OLDEST[1]} only")


def project_sources() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "*.py"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    return [ROOT / p for p in listed if p and (ROOT / p).is_file()]


@ON_OLDEST
def test_every_python_file_parses_on_the_oldest_python_claimed() -> None:
    failed = []
    for path in project_sources():
        try:
            ast.parse(path.read_bytes(), filename=str(path.relative_to(ROOT)))
        except SyntaxError as err:
            failed.append(f"{path.relative_to(ROOT)}:{err.lineno}: {err.msg}")
    assert not failed, failed
    assert len(project_sources()) > 100  # the walk found the project, not an empty folder


@ON_OLDEST
def test_newer_syntax_is_refused_here() -> None:  # negative control: this parser is the oldest's
    with pytest.raises(SyntaxError):
        ast.parse('print(f"{"nested quotes":>13}")')
