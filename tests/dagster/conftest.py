from __future__ import annotations

import pytest

from dagster_project import Project, build_project

from tests.postgres_server import pg_dsn, postgres_server  # noqa: F401  (fixtures)


@pytest.fixture
def project(tmp_path, monkeypatch) -> Project:
    monkeypatch.setenv("TICA_CACHE_DIR", str(tmp_path / "cache"))
    return build_project(tmp_path / "project")
