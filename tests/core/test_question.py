"""Questions: validated, hashed, frozen; a question that contradicts itself is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tica.cli import main
from tica.errors import FrozenQuestionError, QuestionError
from tica.ledger import Ledger
from tica.question import FORMULA_LABELS, ThroughputFormula, load_question
from tica.records import freeze_question

DEMO = Path(__file__).resolve().parents[2] / "demo" / "questions" / "throughput.yaml"


def _write(tmp_path: Path, data: dict, name: str = "q.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def question_data() -> dict:
    return yaml.safe_load(DEMO.read_text())


def test_hash_depends_on_content_not_formatting(tmp_path, question_data):
    a = load_question(_write(tmp_path, question_data, "a.yaml"))
    b = load_question(_write(tmp_path, dict(reversed(list(question_data.items()))), "b.yaml"))
    assert a.hash == b.hash
    question_data["noise_floor"] = 0.06
    assert load_question(_write(tmp_path, question_data, "c.yaml")).hash != a.hash


def test_a_file_rewritten_in_place_is_read_again_whatever_its_mtime(tmp_path, question_data):
    """load_question keeps parsed questions by the bytes read: an edit that keeps size and mtime
    (inside the clock's granularity) is still the new question."""
    import os

    path = _write(tmp_path, question_data)
    first = load_question(path)
    stat = path.stat()
    question_data["noise_floor"] = 0.07
    path.write_text(yaml.safe_dump(question_data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    second = load_question(path)
    assert second.noise_floor == 0.07 and second.hash != first.hash
    assert load_question(path) is second  # the same bytes again: parsed once


def test_the_two_throughput_formulas_carry_their_own_labels(tmp_path, question_data):
    q = load_question(_write(tmp_path, question_data))
    assert q.formula_label == FORMULA_LABELS[ThroughputFormula.MEDIAN_PER_ROUND_PAIRED_LOSS]
    assert "ratio of median throughputs" in FORMULA_LABELS[ThroughputFormula.RATIO_OF_MEDIAN_THROUGHPUTS]


def test_a_frozen_question_refuses_edits(tmp_path, question_data):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    path = _write(tmp_path, question_data)
    first = freeze_question(ledger, path)
    assert freeze_question(ledger, path).hash == first.hash  # freezing again is a no-op
    question_data["criteria"]["budget"] = {1: 0.9, 2: 0.9}
    path.write_text(yaml.safe_dump(question_data))
    with pytest.raises(FrozenQuestionError, match="cannot change"):
        freeze_question(ledger, path)
    assert ledger.query("SELECT question_hash FROM questions")[1] == [(first.hash,)]


def test_a_changed_question_under_a_new_name_is_a_new_question(tmp_path, question_data):
    ledger = Ledger(tmp_path / "l.duckdb").init()
    first = freeze_question(ledger, _write(tmp_path, question_data, "a.yaml"))
    question_data["name"] = "cpu-throughput-v2"
    question_data["criteria"]["tier_ratio"] = 1.3
    second = freeze_question(ledger, _write(tmp_path, question_data, "b.yaml"))
    assert first.hash != second.hash
    assert ledger.query("SELECT count(*) FROM questions")[1] == [(2,)]


@pytest.mark.parametrize(
    ("mutate", "field", "message"),
    [
        (lambda q: q["criteria"].pop("formula"), "criteria.throughput", "budget without a formula"),
        (lambda q: q.update(pairing_order=["AB", "AB", "BA"]), "<root>", "not crossed"),
        (lambda q: q.update(repeats=2), "<root>", "repeats"),
        (lambda q: q["criteria"].update(budget={64: 0.1}), "criteria.throughput", "not in concurrencies"),
        (lambda q: q.update(surprise=1), "surprise", "Extra inputs"),
        (lambda q: q.pop("noise_floor"), "noise_floor", "Field required"),
        (lambda q: q.update(noise_floor=-1), "noise_floor", "greater than or equal"),
    ],
    ids=["budget-without-formula", "uncrossed-order", "repeats-vs-order", "budget-unknown-c", "unknown-field",
         "missing-noise-floor", "negative-noise-floor"],
)
def test_contradictory_or_malformed_questions_name_file_and_field(tmp_path, question_data, mutate, field, message):
    mutate(question_data)
    path = _write(tmp_path, question_data)
    with pytest.raises(QuestionError) as info:
        load_question(path)
    assert info.value.file == str(path) and info.value.field.startswith(field)
    assert message in info.value.message


def test_cli_freeze_of_a_bad_question_writes_nothing(tmp_path, question_data, capsys):
    ledger_path = tmp_path / "l.duckdb"
    good = _write(tmp_path, question_data, "good.yaml")
    assert main(["--ledger", str(ledger_path), "question", "freeze", str(good)]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    assert main(["--ledger", str(ledger_path), "question", "freeze", str(bad)]) == 4  # bad input
    assert "bad.yaml: <yaml>: malformed YAML" in capsys.readouterr().err
    ledger = Ledger(ledger_path)
    assert ledger.query("SELECT count(*) FROM questions")[1] == [(1,)] and ledger.verify().ok
