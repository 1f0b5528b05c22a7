"""`python -m tica_assets.demo` (what `bash scripts/demo.sh --no-ui` runs and exits with) fails when
a track's Dagster run fails: a demo whose evidence job failed must not exit 0."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from tica_assets import demo


class FakeJob:
    def __init__(self, success: bool) -> None:
        self.success = success

    def execute_in_process(self, instance, raise_on_error, run_config=None):
        assert raise_on_error is False  # every track runs; the failures are collected
        return SimpleNamespace(run_id="run-1", success=self.success)


class FakeDefs:
    def __init__(self, failing: set[str]) -> None:
        self.failing = failing
        self.ran: list[str] = []

    def resolve_job_def(self, name: str) -> FakeJob:
        self.ran.append(name)
        return FakeJob(success=name.removesuffix("_evidence") not in self.failing)


TRACKS = [SimpleNamespace(name="cpu-tiny"), SimpleNamespace(name="h200-mid4")]


def test_materialize_names_the_tracks_whose_run_failed():
    defs = FakeDefs(failing={"h200_mid4"})
    assert demo.materialize_tracks(defs, None, TRACKS, None) == ["h200-mid4"]
    assert defs.ran == ["cpu_tiny_evidence", "h200_mid4_evidence"]
    assert demo.materialize_tracks(FakeDefs(failing=set()), None, TRACKS, {"cpu-tiny"}) == []


def test_exit_code_is_nonzero_exactly_when_a_run_failed(capsys):
    assert demo.exit_code([]) == 0
    assert demo.exit_code(["cpu-tiny"]) == 1
    assert "cpu-tiny" in capsys.readouterr().err


@pytest.mark.parametrize("failing,code", [(set(), 0), ({"cpu_tiny"}, 1)])
def test_main_returns_nonzero_when_a_track_run_fails(failing, code, tmp_path, monkeypatch):
    import dagster

    from tica_assets import settings as settings_mod

    for key in demo.DEFAULT_ENV:  # main writes these into os.environ: restored after the test
        monkeypatch.setenv(key, str(tmp_path / key.lower()))
    defs = FakeDefs(failing)
    fake_definitions = types.ModuleType("tica_assets.definitions")
    fake_definitions.build_defs = lambda settings: defs
    fake_tracks = types.ModuleType("tica_assets.tracks")
    fake_tracks.discover_tracks = lambda candidates_dir: TRACKS
    monkeypatch.setitem(sys.modules, "tica_assets.definitions", fake_definitions)
    monkeypatch.setitem(sys.modules, "tica_assets.tracks", fake_tracks)
    monkeypatch.setattr(settings_mod.Settings, "from_env", classmethod(lambda cls: SimpleNamespace(candidates_dir=tmp_path)))
    monkeypatch.setattr(dagster.DagsterInstance, "get", staticmethod(lambda: "instance"))
    monkeypatch.setattr(demo, "prepare_models", lambda data_dir, models: None)
    monkeypatch.setattr(demo, "observe_manifests", lambda defs, instance: None)
    monkeypatch.setattr(demo, "print_report", lambda settings, home, tracks: None)
    assert demo.main(["--models", ""]) == code
    assert defs.ran == ["cpu_tiny_evidence", "h200_mid4_evidence", "h200_matrix"]  # the matrix after the tracks


@pytest.mark.parametrize("python_rc", [0, 1])
def test_demo_sh_no_ui_exits_with_the_demos_code(python_rc, tmp_path):
    """scripts/demo.sh itself, with its setup and the Python it runs stood in for."""
    import shutil
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "scripts").mkdir()
    shutil.copy(repo / "scripts" / "demo.sh", tmp_path / "scripts" / "demo.sh")
    (tmp_path / "scripts" / "setup.sh").write_text("exit 0\n")
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    python = tmp_path / ".venv" / "bin" / "python"
    python.write_text(f"#!/bin/sh\nexit {python_rc}\n")
    python.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(tmp_path / "scripts" / "demo.sh"), "--no-ui"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == python_rc, proc.stderr
