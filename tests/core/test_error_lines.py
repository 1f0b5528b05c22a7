"""A validation error names the file, the line and the dotted field; never a wrong line."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from tests.manifests import BASE_MANIFEST
from tica.errors import ManifestError, QuestionError, ReceiptError, pydantic_errors
from tica.manifest import Manifest, load_manifest
from tica.question import load_question, parse_question
from tica.receipts import load_leg_meta
from tica.strict_io import json_members

QUESTION = """\
name: q-quality
item: quality
compared: per-problem correctness, BI=1 vs BI=0
computation: paired 2x2 over the same problem ids
pass_line: '|score difference| <= 3.34 points'
noise_floor: 0.0
invalid_leg_rule: a leg whose contract differs is rerun
criteria:
  item: quality
  threshold_points: {threshold}
  expected_problems: 30
"""
THRESHOLD_LINE = 10

LEG = {
    "schema": "tica.leg/1", "item": "forward", "arm": "bi1", "producer": "tests", "producer_version": "1",
    "env": {"VLLM_BATCH_INVARIANT": "1"},
    "processes": [{"role": "client", "end_state": "exited", "exit_code": 0},
                  {"role": "api_server", "end_state": "exited", "exit_code": 0}],
}


def _line_of(text: str, needle: str) -> int:
    """1-based line of the only line holding `needle`."""
    hits = [n for n, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(hits) == 1, (needle, hits)
    return hits[0]


def _manifest_file(tmp_path: Path, edit) -> tuple[Path, str]:
    data = copy.deepcopy(BASE_MANIFEST)
    edit(data)
    path = tmp_path / "candidate.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, path.read_text()


def _leg_file(tmp_path: Path, leg: dict) -> tuple[Path, str]:
    path = tmp_path / "leg.json"
    path.write_text(json.dumps(leg, indent=1))
    return path, path.read_text()


def _error(load, path: Path):
    with pytest.raises((ManifestError, QuestionError, ReceiptError)) as info:
        load(path)
    return info.value


# ---------------------------------------------------------------- manifest (YAML)


def test_manifest_wrong_type_names_file_line_and_field(tmp_path: Path) -> None:
    path, text = _manifest_file(tmp_path, lambda d: d["hardware"].update(count_per_node="many"))
    err = _error(load_manifest, path)
    line = _line_of(text, "count_per_node: many")
    assert (err.file, err.line, err.field) == (str(path), line, "hardware.count_per_node")
    assert str(err).startswith(f"{path}: hardware.count_per_node: ") and str(err).endswith(f" (line {line})")


def test_manifest_first_line_is_line_one(tmp_path: Path) -> None:
    path, text = _manifest_file(tmp_path, lambda d: d.update(track="Not A Track"))
    assert text.startswith("track:")
    assert _error(load_manifest, path).line == 1


def test_manifest_missing_field_names_the_mapping_that_lacks_it(tmp_path: Path) -> None:
    path, text = _manifest_file(tmp_path, lambda d: d["hardware"].pop("accelerator"))
    err = _error(load_manifest, path)
    assert (err.field, err.line) == ("hardware.accelerator", _line_of(text, "hardware:"))


def test_manifest_nested_in_a_list_names_the_item_line(tmp_path: Path) -> None:
    path, text = _manifest_file(tmp_path, lambda d: d["workload"].update(concurrencies=[1, "two", 4]))
    err = _error(load_manifest, path)
    assert err.field == "workload.concurrencies.1"
    assert err.line == _line_of(text, "- two")


def test_data_that_is_not_the_file_names_no_line(tmp_path: Path) -> None:
    # The file is valid; the refused value exists only in memory: a line would point at a value
    # the file does not hold.
    path, _ = _manifest_file(tmp_path, lambda d: None)
    data = copy.deepcopy(BASE_MANIFEST)
    data["hardware"]["count_per_node"] = "many"
    with pytest.raises(ValidationError) as info:
        Manifest.model_validate(data)
    err = pydantic_errors(ManifestError, path, info.value)
    assert (err.field, err.line) == ("hardware.count_per_node", None)
    assert str(err).startswith(f"{path}: hardware.count_per_node: ") and "(line" not in str(err)


# ---------------------------------------------------------------- question (YAML)


def test_question_wrong_type_names_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "q.yaml"
    path.write_text(QUESTION.format(threshold="lots"))
    err = _error(load_question, path)
    # pydantic names the union member it tried ("quality"); the file has no such key: stepped over
    assert (err.file, err.line, err.field) == (str(path), THRESHOLD_LINE, "criteria.quality.threshold_points")
    assert str(err).startswith(f"{path}: criteria.quality.threshold_points: ")
    assert str(err).endswith(f" (line {THRESHOLD_LINE})")


def test_question_valid_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "q.yaml"
    path.write_text(QUESTION.format(threshold="3.34"))
    assert load_question(path).criteria.threshold_points == 3.34  # the control: the text is a valid question


def test_question_parsed_from_other_data_names_no_line(tmp_path: Path) -> None:
    path = tmp_path / "q.yaml"
    path.write_text(QUESTION.format(threshold="3.34"))
    data = yaml.safe_load(path.read_text())
    data["criteria"]["threshold_points"] = "lots"
    with pytest.raises(QuestionError) as info:
        parse_question(data, path)
    assert info.value.field == "criteria.quality.threshold_points" and info.value.line is None


# ---------------------------------------------------------------- leg.json (JSON)


def test_leg_json_wrong_type_names_file_line_and_field(tmp_path: Path) -> None:
    path, text = _leg_file(tmp_path, {**LEG, "producer_version": 1})
    err = _error(load_leg_meta, path)
    line = _line_of(text, '"producer_version": 1')
    assert (err.file, err.line, err.field) == (str(path), line, "producer_version")
    assert str(err) == f"{path}: producer_version: {err.message} (line {line})"


def test_leg_json_process_field_names_its_line(tmp_path: Path) -> None:
    leg = copy.deepcopy(LEG)
    leg["processes"][1]["end_state"] = "vanished"
    path, text = _leg_file(tmp_path, leg)
    err = _error(load_leg_meta, path)
    assert (err.field, err.line) == ("processes.1.end_state", _line_of(text, '"vanished"'))


def test_leg_json_valid_file_loads(tmp_path: Path) -> None:
    path, _ = _leg_file(tmp_path, LEG)
    assert load_leg_meta(path).producer_version == "1"  # the control: the same leg without the planted type


def test_leg_json_whole_model_rule_names_no_line(tmp_path: Path) -> None:
    # A rule over the whole leg (arm vs env) belongs to no one line.
    path, _ = _leg_file(tmp_path, {**LEG, "arm": "bi0"})
    err = _error(load_leg_meta, path)
    assert err.field == "<root>" and err.line is None and "VLLM_BATCH_INVARIANT" in err.message


# ---------------------------------------------------------------- the JSON scanner


def test_json_members_follow_keys_through_tricky_strings() -> None:
    text = '{\n "a{": "}\\"x",\n "b": [1,\n  {"c": "[\\n"}],\n "d": {}\n}'
    assert json.loads(text)  # valid JSON
    top = json_members(text, 0)
    assert [line for line, _ in top] == [2, 3, 5]
    b_items = json_members(text, top[1][1])
    assert [line for line, _ in b_items] == [3, 4]
    assert json_members(text, b_items[0][1]) is None  # a number has no members
    assert json_members(text, top[2][1]) == []
