from __future__ import annotations

import pytest

from dagster_project import Project, build_project


@pytest.fixture
def project(tmp_path, monkeypatch) -> Project:
    monkeypatch.setenv("TICA_CACHE_DIR", str(tmp_path / "cache"))
    return build_project(tmp_path / "project")
