"""Every manifest field is bound by a receipt field, held by something else, or declared
informational or UNBOUND (issue 28: "every pin is bound or is not a pin"); README's pin table is
written from the same declarations."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

from tests.false_pass.conftest import manifest_data, write_manifest
from tica.binding import NOT_PINNED_PER_LEG, PINNED_WHEN_SET, pin_table, pins
from tica.judges import load_candidate
from tica.manifest import Manifest

ROOT = Path(__file__).resolve().parents[2]


def _leaves(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, info in model.model_fields.items():
        sub = info.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            out += _leaves(sub, f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


def _candidate(tmp_path):
    return load_candidate(write_manifest(tmp_path, manifest_data()))


def test_every_manifest_field_is_pinned_or_declared(tmp_path, monkeypatch):
    monkeypatch.setenv("TICA_CACHE_DIR", str(tmp_path / "cache"))
    pinned = {re.sub(r" \(mode\)$", "", p.field) for p in pins(_candidate(tmp_path))}
    pinned |= {"runner.trainer"}  # a Pin of its own
    leaves = set(_leaves(Manifest))
    undeclared = leaves - pinned - set(NOT_PINNED_PER_LEG) - set(PINNED_WHEN_SET) - {"graph_cache.max_num_batched_tokens",
                                                              "hardware.driver", "image.digest",
                                                              "recipe.shutdown_timeout"}
    assert undeclared == set(), undeclared
    assert set(NOT_PINNED_PER_LEG) <= leaves, set(NOT_PINNED_PER_LEG) - leaves
    assert not pinned & set(NOT_PINNED_PER_LEG), pinned & set(NOT_PINNED_PER_LEG)


def test_readme_lists_every_pin_with_the_receipt_field_that_binds_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TICA_CACHE_DIR", str(tmp_path / "cache"))
    readme = (ROOT / "README.md").read_text()
    table = pin_table(_candidate(tmp_path))
    assert table in readme, "README's pin table is out of date: paste tica.binding.pin_table's output"
