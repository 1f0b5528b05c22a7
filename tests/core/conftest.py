"""A valid candidate manifest with a small checkpoint, written to a temporary folder."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.manifests import BASE_MANIFEST  # noqa: E402,F401 - the tests' starting manifest


def write_manifest(folder: Path, data: dict[str, Any], name: str = "candidate.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def manifest_data() -> dict[str, Any]:
    return copy.deepcopy(BASE_MANIFEST)


@pytest.fixture
def candidate_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TICA_CACHE_DIR", str(tmp_path / "cache"))
    ckpt = tmp_path / "cand" / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (ckpt / "config.json").write_text('{"hidden_size": 64}')
    return tmp_path / "cand"
