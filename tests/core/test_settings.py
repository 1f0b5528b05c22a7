"""The settings model (tica/settings.py): its table in docs/settings.md, no other module reading a
`TICA_*` variable itself, and values read when used with errors naming the variable."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tica import leg_settings
from tica.settings import SettingsError, settings, setting, variables

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("tica", "tica_assets", "resources", "sensors")
SETTINGS_MODULES = {"tica/settings.py", "tica/leg_settings.py"}
# Modules that pass an environment through (recorded into receipts, or built for a child), not reads.
PASS_THROUGH = {"tica/legs/common.py", "tica/legs/runner.py"}


def _table(section: str) -> set[str]:
    text = (ROOT / "docs" / "settings.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return {m for line in body.splitlines() if line.startswith("| TICA_")
            for m in re.findall(r"TICA_[A-Z0-9_]+", line.split("|")[1])}


def test_every_setting_is_in_the_table_and_the_table_holds_only_settings():
    assert _table("Settings") == set(variables())


def _environ_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """`os.environ.get("TICA_…")`, `os.environ["TICA_…"]`, `os.getenv("TICA_…")`, also through a
    module constant holding the name."""
    consts = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
              and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
              for t in n.targets if isinstance(t, ast.Name)}

    def name_of(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return consts.get(node.id)
        return None

    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ" or (
            isinstance(node, ast.Name) and node.id == "environ")

    out = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args:
            f = node.func
            if isinstance(f, ast.Attribute) and (f.attr in ("get", "pop", "setdefault") and is_environ(f.value)
                                                  or f.attr == "getenv"):
                key = name_of(node.args[0])
            elif isinstance(f, ast.Name) and f.id == "getenv":
                key = name_of(node.args[0])
        elif isinstance(node, ast.Subscript) and is_environ(node.value):
            key = name_of(node.slice)
        if key and key.startswith("TICA_"):
            out.append((node.lineno, key))
    return out


def test_no_module_but_the_settings_reads_a_tica_variable_itself():
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in SETTINGS_MODULES or rel in PASS_THROUGH:
                continue
            found += [f"{rel}:{line}: {key}" for line, key in _environ_reads(ast.parse(path.read_text()))]
    assert found == []


def test_the_scan_sees_a_direct_read():
    tree = ast.parse('import os\nX = "TICA_X"\nos.environ.get(X)\nos.getenv("TICA_Y")\nos.environ["TICA_Z"]\n')
    assert [k for _, k in _environ_reads(tree)] == ["TICA_X", "TICA_Y", "TICA_Z"]


def test_values_are_read_when_used(monkeypatch):
    monkeypatch.setenv("TICA_VERIFY_WORKERS", "3")
    assert setting("verify_workers") == 3
    monkeypatch.setenv("TICA_VERIFY_WORKERS", "0")
    assert setting("verify_workers") == 1
    monkeypatch.delenv("TICA_VERIFY_WORKERS")
    assert setting("verify_workers") is None


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("TICA_VERIFY_WORKERS", "abc", "TICA_VERIFY_WORKERS: <env>: 'abc' is not a number of processes"),
    ("TICA_VERIFY_BATCHES", "2", "TICA_VERIFY_BATCHES: <env>: '2' is not 0 or 1"),
    ("TICA_REPLAY", "h200", "TICA_REPLAY: <env>: 'h200' is not track=folder"),
    ("TICA_SENSOR_INTERVAL_S", "soon", "TICA_SENSOR_INTERVAL_S: <env>: 'soon' is not a whole number of seconds"),
    ("TICA_LEG_RUNNER", "gpu", "TICA_LEG_RUNNER: <env>: 'gpu' is not cpu or ray"),
])
def test_a_bad_value_is_one_sentence_naming_its_variable(variable, value, message):
    with pytest.raises(SettingsError) as err:
        settings({variable: value})
    assert str(err.value) == message


def test_a_bad_value_fails_only_the_work_that_reads_it():
    env = {"TICA_VERIFY_WORKERS": "abc", "TICA_LEDGER": "x.duckdb"}
    assert setting("ledger", env) == "x.duckdb"
    with pytest.raises(SettingsError, match="TICA_VERIFY_WORKERS"):
        setting("verify_workers", env)


@pytest.mark.parametrize("env", [{}, {"TICA_N_STEPS": "2", "TICA_PROGRESS": "off", "TICA_OVERLAY_PARTS": "",
                                      "TICA_CACHE_DIR": "/c", "TICA_IMAGE_DIGEST": "sha256:ab",
                                      "TICA_VLLM_KERNELS_ALLOW_VERSION": "1", "TICA_SMOLLM2_GGUF": "/g"}])
def test_the_leg_side_reader_and_the_model_agree(monkeypatch, env):
    for var in variables():
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    s = settings()
    assert (leg_settings.cache_dir(), leg_settings.progress(), leg_settings.image_digest(), leg_settings.n_steps(),
            leg_settings.overlay_parts(), leg_settings.allow_vllm_version(), leg_settings.smollm2_gguf()) == (
        s.cache_dir, s.progress, s.image_digest, s.n_steps, s.overlay_parts, s.allow_vllm_version, s.smollm2_gguf)


def test_the_code_location_keeps_its_defaults_and_resolves_against_the_project_root():
    from tica_assets.settings import PROJECT_ROOT, Settings

    s = Settings.from_env({})
    assert (s.candidates_dir, s.ledger_path, s.sensor_interval_s, s.leg_runner) == (
        PROJECT_ROOT / "demo" / "candidates", PROJECT_ROOT / "data" / "ledger.duckdb", 15, "cpu")
    s = Settings.from_env({"TICA_LEDGER": "postgresql://u@h/db", "TICA_REPLAY": "a=x, *=/abs"})
    assert s.ledger_path == "postgresql://u@h/db" and s.replay == {"a": PROJECT_ROOT / "x", "*": Path("/abs")}


def test_the_ray_runner_needs_its_address():
    from tica_assets.settings import Settings

    with pytest.raises(SettingsError, match="TICA_RAY_ADDRESS"):
        Settings.from_env({"TICA_LEG_RUNNER": "ray", "TICA_RAY_SHARED_DIR": "/shared"})
    s = Settings.from_env({"TICA_LEG_RUNNER": "ray", "TICA_RAY_ADDRESS": "http://h:8265", "TICA_RAY_SHARED_DIR": "/s"})
    assert (s.leg_runner, s.ray_address, s.ray_shared_dir) == ("ray", "http://h:8265", "/s")


def test_the_environment_is_read_as_text_not_json(monkeypatch):
    monkeypatch.setenv("TICA_REPLAY", "a=x,*=y")
    monkeypatch.setenv("TICA_GPU_TRACKS", "a, b")
    monkeypatch.setenv("TICA_OVERLAY_PARTS", "rmsnorm")
    s = settings()
    assert (s.replay, s.gpu_tracks, s.overlay_parts) == ({"a": Path("x"), "*": Path("y")}, {"a", "b"}, ("rmsnorm",))


def test_tica_leg_runner_ray_makes_the_shared_runner_a_ray_runner():
    pytest.importorskip("dagster_ray")
    from tica_assets.definitions import shared_runner
    from tica_assets.settings import Settings

    env = {"TICA_LEG_RUNNER": "ray", "TICA_RAY_ADDRESS": "http://h:8265", "TICA_RAY_SHARED_DIR": "/s"}
    runner = shared_runner(Settings.from_env(env))
    assert type(runner).__name__ == "RayLegRunner" and (runner.address, runner.shared_dir) == ("http://h:8265", "/s")
    assert type(shared_runner(Settings.from_env({}))).__name__ == "CpuLegRunner"
