"""JSON Schemas of every file TICA reads through a pydantic model, exported from the models.

The models are the truth (they are what `tica judge` and `tica candidate` validate with); these
schemas are their export, for editors, other producers and reviewers. docs/schemas/ holds them
as committed files, regenerated with `tica schema --out docs/schemas`, and a test keeps the two
equal. A JSON Lines file's schema describes one line.

Importing this module is cheap: the model modules (numpy, and scipy behind the question model)
are imported only when a schema is asked for.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from typing import Any

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
ID_PREFIX = "urn:tica:schema:"
FILE_SUFFIX = ".schema.json"


@dataclass(frozen=True)
class SchemaEntry:
    """One exported schema: the model behind it and the file it validates."""

    name: str
    model: str  # "module:attribute", imported on demand
    file: str  # the file, as a user finds it on disk
    about: str  # where that file lives and what it holds


REGISTRY: dict[str, SchemaEntry] = {e.name: e for e in (
    SchemaEntry("manifest", "tica.manifest:Manifest", "candidate manifest (YAML)",
                "one file per candidate track, e.g. demo/candidates/cpu-tiny.yaml"),
    SchemaEntry("question", "tica.question:Question", "question (YAML)",
                "the frozen criteria of one evidence item, e.g. demo/questions/forward.yaml"),
    SchemaEntry("leg", "tica.receipts:LegMeta", "leg.json",
                "in every leg directory; its `processes` are the exit receipts clean_exit judges"),
    SchemaEntry("forward-step", "tica.receipts:ForwardStep", "metrics.jsonl (forward)",
                "one line per step of a forward leg, and of an update leg's post_forward/"),
    SchemaEntry("backward-step", "tica.receipts:BackwardStep", "metrics.jsonl (backward)",
                "one line per step of a backward leg"),
    SchemaEntry("update-step", "tica.receipts:UpdateStep", "metrics.jsonl (update)",
                "one line per step of an update leg"),
    SchemaEntry("quality-result", "tica.receipts:ProblemResult", "results.jsonl",
                "one line per problem of a quality leg"),
    SchemaEntry("quality-contract", "tica.receipts:RecordedEvalContract", "contract.json",
                "in a quality leg: the six items of the evaluation contract"),
    SchemaEntry("bench", "tica.receipts:BenchResult", "bench.json",
                "in a throughput leg, or a bare `vllm bench serve --save-result` file"),
    SchemaEntry("gradcheck", "tica.receipts:GradcheckFile", "gradcheck.json",
                "in a backward leg: the gradient check and its planted-error controls (judged under the "
                "question's gradcheck_rel_tol)"),
    SchemaEntry("recipe-dry-runs", "tica.receipts:RecipeDryRuns", "recipe_dry_runs.json",
                "the recipe's resolved commands per mode, optimizer and arm (tica judge recipe)"),
)}


# What a model's before-validators accept beside the type its schema states. `vllm bench serve
# --metadata k=v` writes every value as a string; BenchResult reads round=1 as 1 and
# ignore_eos=true as True, so the exported schema must accept the strings a real bench.json holds.
_INT_TEXT = {"type": "string", "pattern": "^\\s*-?[0-9]+\\s*$"}
_BOOL_TEXT = {"type": "string", "pattern": "^([Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee]|[01])$"}
_ALSO_ACCEPTED: dict[str, dict[str, dict[str, Any]]] = {
    "bench": {
        "round": _INT_TEXT,
        "slot": {"type": "string", "pattern": "^\\s*[12]\\s*$"},
        "num_warmups": _INT_TEXT,
        "ignore_eos": _BOOL_TEXT,
        "profiled": _BOOL_TEXT,
    },
}


def names() -> list[str]:
    """Every exported schema's name, in registry order."""
    return list(REGISTRY)


def entry(name: str) -> SchemaEntry:
    """The registry entry of `name`; KeyError names the known ones."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown schema {name!r}: known are {', '.join(REGISTRY)}") from None


def model_of(name: str) -> type:
    """The pydantic model behind schema `name` (imports its module)."""
    module, attr = entry(name).model.split(":")
    return getattr(importlib.import_module(module), attr)


def schema(name: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the file that schema `name` validates."""
    e = entry(name)
    body = model_of(name).model_json_schema()  # validation mode, by alias: what a file may hold
    for key, alternative in _ALSO_ACCEPTED.get(name, {}).items():
        body["properties"][key]["anyOf"].insert(-1, dict(alternative))  # before the trailing null
    description = f"Validates {e.file} ({e.about}). Exported from {e.model.replace(':', '.')}."
    if body.get("description"):  # the model's docstring
        description += " " + body["description"]
    head = {"$schema": JSON_SCHEMA_DIALECT, "$id": ID_PREFIX + name, "title": f"TICA {e.file}",
            "description": description}
    return {**head, **{k: v for k, v in body.items() if k not in head}}


def schema_text(name: str) -> str:
    """schema(name) as docs/schemas/NAME.schema.json holds it: indented, one final newline."""
    return json.dumps(schema(name), indent=2, ensure_ascii=False) + "\n"


def file_name(name: str) -> str:
    """The exported file's name: NAME.schema.json."""
    return entry(name).name + FILE_SUFFIX
