"""Every receipt field is read by a rule or declared informational (issue 27, accounting): the
models are walked, so a field added without a declaration fails here, and a declaration that
names a rule's module which never mentions the field fails too."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

import tica.receipts as receipts
from tica.receipt_fields import FIELD_RULES

ROOT = Path(__file__).resolve().parents[2]


def _models() -> dict[str, type[BaseModel]]:
    return {name: obj for name, obj in vars(receipts).items()
            if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == receipts.__name__
            and obj.model_fields}


def test_every_field_of_every_receipt_model_is_declared():
    models = _models()
    assert set(models) == set(FIELD_RULES), "a receipt model without declarations, or a declaration of no model"
    for name, model in models.items():
        assert set(model.model_fields) == set(FIELD_RULES[name]), (name, set(model.model_fields) ^ set(FIELD_RULES[name]))


def test_each_declaration_is_a_rule_or_informational():
    for name, fields in FIELD_RULES.items():
        for field, text in fields.items():
            assert re.match(r"^(rule: tica/[\w/]+\.py: |informational: )\S", text), (name, field, text)


def test_a_rule_names_a_module_that_reads_the_field():
    """A plausibility check of each claim: the module named mentions the field (by attribute,
    key or alias)."""
    models = _models()
    for name, fields in FIELD_RULES.items():
        for field, text in fields.items():
            if not text.startswith("rule: "):
                continue
            module = text.split(": ")[1]
            source = (ROOT / module).read_text()
            info = models[name].model_fields[field]
            spellings = {field, field.rstrip("_"), *(a for a in (info.alias,) if a)}
            assert any(re.search(rf"(\.|\"|'|\b){re.escape(s)}\b", source) for s in spellings), (name, field, module)


def test_every_tica_key_of_the_committed_matrix_rows_is_declared(tmp_path):
    """The matrix producer writes `tica/*` keys beside a forward step's fields: every key any
    committed matrix receipt carries is declared, and a rule names a module that reads it."""
    import json

    from tica.receipt_archive import unpacked
    from tica.receipt_fields import MATRIX_ROW_EXTRAS

    seen: set[str] = set()
    for archive in sorted((ROOT / "tests" / "fixtures" / "h200").glob("matrix*.tar.xz")):
        for rows in unpacked(archive, tmp_path / archive.name).rglob("metrics.jsonl"):
            for line in rows.read_text().splitlines():
                seen |= {k for k in json.loads(line) if k.startswith("tica/")}
    declared_fields = {info.alias for info in receipts.ForwardStep.model_fields.values() if info.alias}
    assert seen - declared_fields <= set(MATRIX_ROW_EXTRAS), sorted(seen - declared_fields - set(MATRIX_ROW_EXTRAS))
    for key, text in MATRIX_ROW_EXTRAS.items():
        assert re.match(r"^(rule: tica/[\w/]+\.py: |informational: )\S", text), (key, text)
        if text.startswith("rule: "):
            assert key in (ROOT / text.split(": ")[1]).read_text(), (key, text)
