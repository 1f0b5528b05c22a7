"""`tica leg ingest verl-mlflow | verl-wandb`: verl's per-step metrics as a tracker stored them
become the same forward leg as verl's own file logger gives (`verl-metrics`), judged the same.

The first test writes its MLflow store with the real `mlflow` (the `test` extra), as verl's MLflow
logger does (`mlflow.log_metrics(metrics, step=step)`). The malformed stores are written by hand,
laid out as MLflow's FileStore lays them out (mlflow/store/tracking/file_store.py: `meta.yaml` in
the experiment and run folders; `metrics/<key>` holding `<timestamp> <value> <step>` lines, a key's
`/` a folder; `params/<key>` and `tags/<key>` holding the value). W&B history exports are the rows
`run.scan_history()` yields (`_step`, `_runtime`, `_timestamp`, metric keys), as JSONL, a JSON
array, or pandas' `to_csv` of `run.history()`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tica.errors import InputError
from tica.ingest import ingest_verl_metrics, ingest_verl_mlflow, ingest_verl_wandb
from tica.cli.ingest import main
from tica.items.forward.judge import judge_forward
from tica.question import load_question, parse_question
from tica.receipts import load_jsonl, load_leg
from tica.verdict import Verdict

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
STEPS = range(1, 6)


def _verl_metrics(diff: float) -> dict[int, dict[str, float]]:
    """What verl's trainer logs per step (validation only at step 0), the forward keys among them."""
    rows = {0: {"val-core/openai/gsm8k/reward/mean_at_1": 0.5}}
    for s in STEPS:
        rows[s] = {"training/rollout_probs_diff_valid": 1, "training/rollout_probs_diff_max": diff,
                   "training/rollout_probs_diff_mean": diff / 10, "training/rollout_probs_diff_std": diff / 20,
                   "actor/grad_norm": 0.3, "actor/pg_loss": -0.01 * s, "timing_s/gen": 1.25}
    return rows


def _forward_cell(bi1: Path, bi0: Path):
    q = load_question(ROOT / "receipts" / "questions" / "forward.yaml")
    return judge_forward(parse_question({**q.model_dump(mode="json"), "must_record": []}), [bi1, bi0])


def _verl_jsonl(tmp: Path, diff: float) -> Path:
    p = tmp / f"verl_{diff}.jsonl"
    p.write_text("".join(json.dumps({"step": s, **m}) + "\n" for s, m in _verl_metrics(diff).items()))
    return p


# ---------------------------------------------------------------- MLflow


def _mlflow_store(tmp: Path, diff: float, monkeypatch, version: str | None = None) -> Path:
    mlflow = pytest.importorskip("mlflow")
    store = tmp / f"mlruns_{diff}"
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.x refuses a file store without it
    mlflow.set_tracking_uri(store.as_uri())
    try:
        mlflow.set_experiment("verl_project")
        with mlflow.start_run(run_name="verl_experiment"):
            mlflow.log_params({"actor_rollout_ref/rollout/name": "vllm", "trainer/total_epochs": 1})
            if version:
                mlflow.set_tag("verl_version", version)
            for step, metrics in _verl_metrics(diff).items():
                mlflow.log_metrics(metrics, step=step)
    finally:
        mlflow.set_tracking_uri(None)
    return store


def test_an_mlflow_run_is_the_same_forward_leg_as_verls_file_logger_and_judged_the_same(tmp_path, monkeypatch):
    legs = {}
    for arm, diff in (("bi1", 0.0), ("bi0", 0.02)):
        store = _mlflow_store(tmp_path, diff, monkeypatch)
        legs["mlflow", arm] = ingest_verl_mlflow(store, tmp_path / "mlflow" / arm, arm)
        legs["file", arm] = ingest_verl_metrics(_verl_jsonl(tmp_path, diff), tmp_path / "file" / arm, arm)
    for arm in ("bi1", "bi0"):
        assert load_jsonl(legs["mlflow", arm] / "metrics.jsonl") == load_jsonl(legs["file", arm] / "metrics.jsonl")
    meta = load_leg(legs["mlflow", "bi1"]).meta
    assert (meta.producer, meta.producer_version) == ("verl", None)  # verl tags no version: unknown
    assert meta.resolved_config["mlflow_params"]["actor_rollout_ref/rollout/name"] == "vllm"
    note = json.loads((legs["mlflow", "bi1"] / "source.json").read_text())
    assert note["steps_without_forward_metrics"] == [0]
    assert "metrics/training/rollout_probs_diff_max" in note["files"]
    by_mlflow = _forward_cell(legs["mlflow", "bi1"], legs["mlflow", "bi0"])
    by_file = _forward_cell(legs["file", "bi1"], legs["file", "bi0"])
    assert by_mlflow.verdict is by_file.verdict is Verdict.INCONCLUSIVE
    assert by_mlflow.reasons == by_file.reasons
    assert any("unknown: step_basis, checkpoint_version" in r for r in by_mlflow.reasons), by_mlflow.reasons


def test_the_verl_version_is_read_from_the_runs_tag_and_a_contradicting_flag_is_refused(tmp_path, monkeypatch):
    store = _mlflow_store(tmp_path, 0.0, monkeypatch, version="0.5.0")
    leg = ingest_verl_mlflow(store, tmp_path / "leg", "bi1")
    assert load_leg(leg).meta.producer_version == "0.5.0"
    with pytest.raises(InputError) as err:
        ingest_verl_mlflow(store, tmp_path / "leg2", "bi1", producer_version="0.4.1")
    assert err.value.file.endswith("tags/verl_version") and not (tmp_path / "leg2").exists()


def _hand_store(tmp: Path, runs: dict[str, dict[str, str]]) -> Path:
    """An MLflow file store laid out as FileStore writes it: {run_id: {metric key: file text}}."""
    exp = tmp / "mlruns" / "123"
    exp.mkdir(parents=True)
    (exp / "meta.yaml").write_text("experiment_id: '123'\nlifecycle_stage: active\nname: verl_project\n")
    for run_id, metrics in runs.items():
        run = exp / run_id
        (run / "artifacts").mkdir(parents=True)
        (run / "meta.yaml").write_text(f"experiment_id: '123'\nlifecycle_stage: active\nrun_id: {run_id}\n"
                                       f"run_name: r\nstatus: 3\n")
        for key, text in metrics.items():
            (run / "metrics" / key).parent.mkdir(parents=True, exist_ok=True)
            (run / "metrics" / key).write_text(text)
    return tmp / "mlruns"


GOOD = "".join(f"17000000{s} 0.01 {s}\n" for s in STEPS)


def test_a_malformed_mlflow_metric_line_is_refused_naming_file_and_line(tmp_path, capsys):
    bad = GOOD.replace("0.01 2\n", "zero 2\n")
    store = _hand_store(tmp_path, {"a" * 32: {"training/rollout_probs_diff_max": bad}})
    assert main(["verl-mlflow", str(store), "--out", str(tmp_path / "leg"), "--arm", "bi1", "--json"]) == 4
    out, err = capsys.readouterr()
    error = json.loads(out)["error"]
    metric_file = store / "123" / ("a" * 32) / "metrics" / "training" / "rollout_probs_diff_max"
    assert (error["file"], error["field"], error["line"]) == (str(metric_file), "value", 2)
    assert "(line 2)" in err and not (tmp_path / "leg").exists()
    ok = _hand_store(tmp_path / "ok", {"a" * 32: {"training/rollout_probs_diff_max": GOOD}})
    assert main(["verl-mlflow", str(ok), "--out", str(tmp_path / "leg"), "--arm", "bi1"]) == 0  # control


def test_an_mlflow_value_logged_without_its_step_is_refused(tmp_path):
    store = _hand_store(tmp_path, {"a" * 32: {"training/rollout_probs_diff_max": GOOD + "170000009 0.01\n"}})
    with pytest.raises(InputError) as err:
        ingest_verl_mlflow(store, tmp_path / "leg", "bi1")
    assert (err.value.field, err.value.line) == ("step", 6) and not (tmp_path / "leg").exists()


def test_a_store_with_two_runs_and_none_chosen_is_refused_and_run_id_chooses(tmp_path):
    store = _hand_store(tmp_path, {"a" * 32: {"training/rollout_probs_diff_max": GOOD},
                                   "b" * 32: {"training/rollout_probs_diff_max": GOOD.replace("0.01", "0.02")}})
    with pytest.raises(InputError) as err:
        ingest_verl_mlflow(store, tmp_path / "leg", "bi1")
    assert err.value.field == "run_id" and "a" * 32 in err.value.message and "b" * 32 in err.value.message
    assert not (tmp_path / "leg").exists()
    leg = ingest_verl_mlflow(store, tmp_path / "leg", "bi1", run_id="b" * 32)
    assert load_jsonl(leg / "metrics.jsonl")[0]["training/rollout_probs_diff_max"] == 0.02


# ---------------------------------------------------------------- W&B history export


def _history(diff: float) -> list[dict]:
    """Rows as `run.scan_history()` yields them for verl's `wandb.log(data, step=step)`."""
    return [{"_step": s, "_runtime": 10.0 * s, "_timestamp": 1.7e9 + s, **m} for s, m in _verl_metrics(diff).items()]


def _export(tmp: Path, rows: list[dict], fmt: str) -> Path:
    p = tmp / f"history_{len(list(tmp.iterdir()))}.{fmt}"
    if fmt == "jsonl":
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        p.write_text(json.dumps(rows))
    else:
        import pandas as pd

        pd.DataFrame(rows).to_csv(p)  # as `run.history()` returns it: its index first, NaN where not logged
    return p


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv"])
def test_a_wandb_history_export_is_the_same_forward_leg_as_verls_file_logger(tmp_path, fmt):
    for arm, diff in (("bi1", 0.0), ("bi0", 0.02)):
        wandb = ingest_verl_wandb(_export(tmp_path, _history(diff), fmt), tmp_path / "wandb" / arm, arm)
        file = ingest_verl_metrics(_verl_jsonl(tmp_path, diff), tmp_path / "file" / arm, arm)
        assert load_jsonl(wandb / "metrics.jsonl") == load_jsonl(file / "metrics.jsonl")
    assert load_leg(tmp_path / "wandb" / "bi1").meta.producer_version is None
    cell = _forward_cell(tmp_path / "wandb" / "bi1", tmp_path / "wandb" / "bi0")
    assert cell.reasons == _forward_cell(tmp_path / "file" / "bi1", tmp_path / "file" / "bi0").reasons


def test_a_wandb_row_without_its_step_is_refused_naming_its_line(tmp_path):
    rows = _history(0.0)
    del rows[2]["_step"]
    with pytest.raises(InputError) as err:
        ingest_verl_wandb(_export(tmp_path, rows, "jsonl"), tmp_path / "leg", "bi1")
    assert err.value.field == "line 3._step" and not (tmp_path / "leg").exists()
    ingest_verl_wandb(_export(tmp_path, _history(0.0), "jsonl"), tmp_path / "leg", "bi1")  # control


def test_a_wandb_step_twice_is_refused(tmp_path):
    rows = _history(0.0)
    rows[3]["_step"] = rows[2]["_step"]
    with pytest.raises(InputError) as err:
        ingest_verl_wandb(_export(tmp_path, rows, "csv"), tmp_path / "leg", "bi1")
    assert err.value.field == "line 5._step" and "first on line 4" in err.value.message


def test_a_csv_cell_past_the_csv_readers_limit_is_refused_naming_its_line(tmp_path):
    """Issue 32: a 128 KiB cell was a traceback (the csv module's field limit)."""
    rows = _history(0.0)
    rows[1]["note"] = "x" * 200_000
    with pytest.raises(InputError) as err:
        ingest_verl_wandb(_export(tmp_path, rows, "csv"), tmp_path / "leg", "bi1")
    assert err.value.field == "<csv>" and "field larger than field limit" in err.value.message
    assert not (tmp_path / "leg").exists()
