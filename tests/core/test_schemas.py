"""The exported JSON Schemas: committed equal to the models' export, valid, and true to real files."""

from __future__ import annotations

import argparse
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tica import schemas
from tica.cli import schema as schema_cli
from tica.errors import EXIT_BAD_INPUT, UsageParser

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "schemas"
FIXTURES = ROOT / "tests" / "fixtures"
REGENERATE = "tica schema --out docs/schemas  (or: .venv/bin/python -m tica.cli.schema --out docs/schemas)"
STEP_SCHEMA = {"forward": "forward-step", "backward": "backward-step", "update": "update-step"}

jsonschema = pytest.importorskip("jsonschema")


def _validator(name: str):
    return jsonschema.Draft202012Validator(schemas.schema(name))


def _problems(name: str, value) -> list[str]:
    errors = _validator(name).iter_errors(value)
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors]


# ---------------------------------------------------------------- committed files cannot drift


@pytest.mark.parametrize("name", schemas.names())
def test_committed_schema_equals_export(name: str) -> None:
    committed = DOCS / schemas.file_name(name)
    assert committed.is_file(), f"{committed} is missing: regenerate with {REGENERATE}"
    assert committed.read_text(encoding="utf-8") == schemas.schema_text(name), (
        f"{committed} differs from what {schemas.entry(name).model} exports now: regenerate with {REGENERATE}")


def test_no_committed_schema_without_a_model() -> None:
    exported = {schemas.file_name(n) for n in schemas.names()}
    stray = sorted(p.name for p in DOCS.glob("*" + schemas.FILE_SUFFIX) if p.name not in exported)
    assert not stray, f"docs/schemas holds {stray}, which no model exports: delete them, then {REGENERATE}"


def test_readme_links_every_schema() -> None:
    readme = (DOCS / "README.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([\w-]+\.schema\.json)\)", readme))
    assert linked == {schemas.file_name(n) for n in schemas.names()}


# ---------------------------------------------------------------- what a schema says


@pytest.mark.parametrize("name", schemas.names())
def test_schema_is_valid_draft_2020_12(name: str) -> None:
    jsonschema.Draft202012Validator.check_schema(schemas.schema(name))


@pytest.mark.parametrize("name", schemas.names())
def test_schema_names_its_id_and_the_file_it_validates(name: str) -> None:
    s = schemas.schema(name)
    e = schemas.entry(name)
    assert s["$id"] == schemas.ID_PREFIX + name
    assert e.file in s["title"] and f"Validates {e.file}" in s["description"]


def test_importing_schemas_loads_no_heavy_module() -> None:
    heavy = ("torch", "duckdb", "scipy", "numpy", "dagster")
    probe = "import sys, {m}; print(sorted(x for x in {h!r} if x in sys.modules))"
    loaded = lambda module: subprocess.run(  # noqa: E731
        [sys.executable, "-c", probe.format(m=module, h=heavy)], capture_output=True, text=True, check=True,
        cwd=ROOT).stdout.strip()
    assert loaded("tica.schemas") == "[]"
    # negative control: the probe sees a heavy import when there is one (the ledger pulls duckdb)
    assert "duckdb" in loaded("tica.ledger")


def _receipt_models() -> set[str]:
    from pydantic import BaseModel

    import tica.receipts as receipts

    return {name for name, obj in vars(receipts).items()
            if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == receipts.__name__
            and not name.startswith("_")}


def _unexported(models: set[str]) -> set[str]:
    """Models neither exported as a schema nor nested in one ($defs)."""
    covered = {schemas.entry(n).model.split(":")[1] for n in schemas.names()}
    for n in schemas.names():
        covered |= set(schemas.schema(n).get("$defs", {}))
    return models - covered


def test_every_receipt_model_is_exported_or_nested_in_an_export() -> None:
    assert _unexported(_receipt_models()) == set()
    assert _unexported({"NotARealReceipt"}) == {"NotARealReceipt"}  # negative control: the check can fail


# ---------------------------------------------------------------- true to the files TICA reads


def test_demo_manifests_and_questions_validate() -> None:
    files = [("manifest", p) for p in sorted((ROOT / "demo" / "candidates").glob("*.yaml"))]
    files += [("question", p) for p in sorted((ROOT / "demo" / "questions").rglob("*.yaml"))]
    assert len(files) > 3
    bad = {str(p.relative_to(ROOT)): _problems(name, yaml.safe_load(p.read_text())) for name, p in files}
    assert {k: v for k, v in bad.items() if v} == {}


def _fixture_receipts() -> list[tuple[str, Path, object]]:
    """(schema, file, value) for every receipt file under tests/fixtures a model reads."""
    out: list[tuple[str, Path, object]] = []
    for leg_json in sorted(FIXTURES.rglob("leg.json")):
        leg = leg_json.parent
        meta = json.loads(leg_json.read_text())
        out.append(("leg", leg_json, meta))
        jsonl = [("quality-result", leg / "results.jsonl"), ("forward-step", leg / "post_forward" / "metrics.jsonl")]
        if meta.get("item") in STEP_SCHEMA:
            jsonl.append((STEP_SCHEMA[meta["item"]], leg / "metrics.jsonl"))
        for name, path in jsonl:
            if path.is_file():
                out += [(name, path, json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
        for name, path in (("quality-contract", leg / "contract.json"), ("bench", leg / "bench.json"),
                           ("gradcheck", leg / "gradcheck.json")):
            if path.is_file():
                out.append((name, path, json.loads(path.read_text())))
    out += [("recipe-dry-runs", p, json.loads(p.read_text())) for p in sorted(FIXTURES.rglob("recipe_dry_runs.json"))]
    return out


def test_fixture_receipts_validate() -> None:
    receipts = _fixture_receipts()
    assert {name for name, _, _ in receipts} == set(schemas.names()) - {"manifest", "question"}
    bad = [f"{p.relative_to(ROOT)} ({name}): {_problems(name, v)[:2]}" for name, p, v in receipts if _problems(name, v)]
    assert bad == []


def test_bench_schema_accepts_metadata_strings_and_refuses_other_text() -> None:
    bench = json.loads(next(FIXTURES.rglob("bench.json")).read_text())
    # `--metadata round=1 slot=2 ignore_eos=true` writes strings: the model reads them, so must the schema
    assert _problems("bench", {**bench, "round": "1", "slot": "2", "ignore_eos": "true", "num_warmups": "1"}) == []
    assert _problems("bench", {**bench, "round": "first"})  # negative control
    assert _problems("bench", {**bench, "slot": "3"})


def test_schema_refuses_a_planted_wrong_type() -> None:
    meta = json.loads(next(FIXTURES.rglob("leg.json")).read_text())
    assert _problems("leg", meta) == []
    assert _problems("leg", {**meta, "producer_version": 1})
    assert _problems("leg", {**meta, "unknown_field": 1})


# ---------------------------------------------------------------- tica schema


def _run(*argv: str) -> tuple[int, str]:
    parser = UsageParser(prog="tica")
    schema_cli.add_parser(parser.add_subparsers(dest="command", required=True))
    out = io.StringIO()
    return schema_cli.run(parser.parse_args(["schema", *argv]), out=out), out.getvalue()


def test_cli_prints_the_schema_of_name() -> None:
    rc, out = _run("leg")
    assert rc == 0 and json.loads(out) == schemas.schema("leg")


def test_cli_list_names_each_schema_with_its_file() -> None:
    rc, out = _run("--list")
    rows = [line.split(None, 1) for line in out.splitlines()]
    assert rc == 0 and [r[0] for r in rows] == schemas.names()
    assert all(schemas.entry(name).file in rest for name, rest in rows)


def test_cli_out_writes_every_schema(tmp_path: Path) -> None:
    rc, _ = _run("--out", str(tmp_path))
    assert rc == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(schemas.file_name(n) for n in schemas.names())
    assert all((tmp_path / schemas.file_name(n)).read_text() == schemas.schema_text(n) for n in schemas.names())


def test_cli_unknown_name_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _run("legg")
    err = capsys.readouterr().err
    assert rc == EXIT_BAD_INPUT and out == ""
    assert "unknown schema 'legg'" in err and "leg" in err.split("known are", 1)[1]


def test_cli_list_with_a_name_is_bad_input() -> None:
    rc, _ = _run("--list", "leg")
    assert rc == EXIT_BAD_INPUT
    assert _run("--list")[0] == 0  # negative control


def test_cli_without_name_list_or_out_is_bad_input() -> None:
    assert _run()[0] == EXIT_BAD_INPUT


def test_cli_parser_is_an_argparse_subcommand() -> None:
    parser = argparse.ArgumentParser()
    p = schema_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["schema", "bench"])
    assert args.func is schema_cli.run and args.name == "bench" and p.prog.endswith("schema")
