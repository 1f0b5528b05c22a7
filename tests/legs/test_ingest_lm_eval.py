"""`tica leg ingest lm-eval`: an `lm_eval --log_samples` output becomes a sealed quality leg. Each
doc's correctness comes from the task's metric; the contract holds what lm_eval's results JSON
records of the six items, and an item it does not record is unknown: listed by the judge, and the
cell is inconclusive for it, never passed.

The committed fixture (tests/fixtures/lm_eval/out) is a real `lm_eval` 0.4.13 run on the tiny
model over tica/problems/lm_eval/tica_arith30.yaml, its samples trimmed to the first 4 docs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tica.errors import InputError
from tica.ingest import SOURCE_FILE, ingest_lm_eval
from tica.cli.ingest import main
from tica.items.quality.judge import judge_quality
from tica.items.quality.receipts import load_recorded_contract
from tica.question import load_question, parse_question
from tica.receipts import load_leg_meta, load_quality_results
from tica.verdict import Verdict

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
OUT = FIXTURES / "lm_eval" / "out"


def _copy(tmp: Path) -> Path:
    dst = tmp / "lm_eval_out"
    shutil.copytree(OUT, dst)
    return dst


def _results_file(out: Path) -> Path:
    [p] = out.rglob("results_*.json")
    return p


def _samples_file(out: Path) -> Path:
    [p] = out.rglob("samples_*.jsonl")
    return p


def _edit_results(out: Path, change) -> None:
    p = _results_file(out)
    data = json.loads(p.read_text())
    change(data)
    p.write_text(json.dumps(data))


def _question(n: int):
    q = load_question(FIXTURES / "receipts" / "questions" / "quality.yaml").model_dump(mode="json")
    q["criteria"].update(expected_problems=n, threshold_points=100.0)
    q["pass_line"] = "|score diff| <= 100 points"
    return parse_question(q)


def test_each_doc_becomes_a_problem_result_correct_from_the_task_metric(tmp_path):
    leg = ingest_lm_eval(OUT, tmp_path / "leg", "bi0", task="tica_arith30")
    results = load_quality_results(leg / "results.jsonl")
    assert [r.problem_id for r in results] == ["p001", "p002", "p003", "p004"]  # the doc's own id
    assert all(r.correct is False for r in results)  # exact_match 0.0 on every doc of the real run
    first = results[0]
    assert first.extracted == "719" and first.response.startswith("t719")
    assert first.prompt_hash.startswith("sha256:") and first.truncated is None  # lm_eval does not record it
    source = json.loads((leg / SOURCE_FILE).read_text())
    assert source["metric"] == "exact_match" and source["filter"] == "take-first-number"
    assert source["problem_id_from"] == "problem_id" and source["contract_unknown"] == []
    meta = load_leg_meta(leg / "leg.json")
    assert meta.item == "quality" and meta.arm == "bi0"
    assert meta.producer == "lm_eval" and meta.producer_version == "0.4.13"
    assert meta.env == {} and meta.device == {}  # lm_eval records neither: unknown, not invented


def test_the_contract_is_what_the_results_json_records(tmp_path):
    leg = ingest_lm_eval(OUT, tmp_path / "leg", "bi1")  # the only task: --task may be left out
    c = load_recorded_contract(leg / "contract.json")
    dataset = json.loads(c.dataset_version)
    assert dataset["task"] == "tica_arith30" and dataset["version"] == 1.0 and dataset["task_hash"]
    prompt = json.loads(c.prompt_template)
    assert prompt["doc_to_text"] == "Question: {{question}}\nAnswer:" and prompt["num_fewshot"] == 0
    assert prompt["chat_template"] is None  # recorded as not applied
    assert c.thinking_mode == "none"
    assert c.sampling.temperature == 0 and c.sampling.stop == ("\n",)
    assert c.repeats == 1 and c.length_cap == 8
    scorer = json.loads(c.scorer)
    assert scorer["metric"]["metric"] == "exact_match" and scorer["filter_list"][0]["name"] == "take-first-number"


def test_a_contract_item_lm_eval_did_not_record_stays_unknown_and_the_cell_is_inconclusive(tmp_path):
    out = _copy(tmp_path)
    _edit_results(out, lambda d: d["configs"]["tica_arith30"]["generation_kwargs"].pop("max_gen_toks"))
    bi1 = ingest_lm_eval(out, tmp_path / "bi1", "bi1")
    bi0 = ingest_lm_eval(OUT, tmp_path / "bi0", "bi0")
    contract = json.loads((bi1 / "contract.json").read_text())
    assert "length_cap" not in contract  # never lm_eval's default filled in
    assert any(u.startswith("length_cap") for u in json.loads((bi1 / SOURCE_FILE).read_text())["contract_unknown"])
    cell = judge_quality(_question(4), [bi1, bi0])
    assert cell.verdict is not Verdict.PASS
    assert cell.numbers["contract_unknown"] == ["length cap"]
    assert any("evaluation contract item unknown: length cap" in r and "BI=1 bi1" in r for r in cell.reasons)


def test_identical_runs_differ_in_no_contract_item(tmp_path):
    bi1 = ingest_lm_eval(OUT, tmp_path / "bi1", "bi1")
    bi0 = ingest_lm_eval(OUT, tmp_path / "bi0", "bi0")
    cell = judge_quality(_question(4), [bi1, bi0])
    assert cell.numbers["contract_differs"] == [] and cell.numbers["contract_unknown"] == []


def test_a_leg_without_contract_json_is_contract_unknown_not_a_crash(tmp_path):
    from tica.ingest import ingest_problems

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"problem_id": f"p{i}", "correct": False}) + "\n" for i in range(4)))
    bi1 = ingest_problems(rows, tmp_path / "bi1", "bi1")  # no --contract: unknown
    bi0 = ingest_lm_eval(OUT, tmp_path / "bi0", "bi0")
    cell = judge_quality(_question(4), [bi1, bi0])
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert len(cell.numbers["contract_unknown"]) == 6
    assert any("contract unknown (no contract.json)" in r for r in cell.reasons)


def test_a_malformed_sample_line_exits_4_naming_file_and_line(tmp_path, capsys):
    out = _copy(tmp_path)
    samples = _samples_file(out)
    lines = samples.read_text().splitlines()
    lines[2] = lines[2][:40]  # cut mid-object
    samples.write_text("\n".join(lines) + "\n")
    assert main(["lm-eval", str(out), "--out", str(tmp_path / "leg"), "--arm", "bi0"]) == 4
    err = capsys.readouterr().err
    assert samples.name in err and "line 3" in err
    assert not (tmp_path / "leg").exists()


def test_a_metric_that_is_not_0_or_1_is_refused_naming_the_line(tmp_path):
    out = _copy(tmp_path)
    samples = _samples_file(out)
    rows = [json.loads(x) for x in samples.read_text().splitlines()]
    rows[1]["exact_match"] = 0.5
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(InputError) as e:
        ingest_lm_eval(out, tmp_path / "leg", "bi0")
    assert e.value.field == "line 2.exact_match" and samples.name in str(e.value)


def test_the_arm_is_never_guessed(tmp_path, capsys):
    assert main(["lm-eval", str(OUT), "--out", str(tmp_path / "leg"), "--arm", "bi1", "--contract", "c.json"]) == 4
    assert "--contract" in capsys.readouterr().err


# The docs/leg-run.md walkthrough itself (real `lm_eval --model hf` on the tiny model under `tica leg
# run`, once per arm, each output ingested and the pair judged) runs in
# tests/legs/test_walkthrough_report.py, whose runs are those commands: one set of lm_eval runs
# for both tests.
