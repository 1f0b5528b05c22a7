"""Issue 13, "Bring your own runs": judge runs you already have, together, in the track's report.

Real files from the real tools on this machine (tests/legs/walkthrough_project.py makes them, as
docs/leg-run.md "Judge them together" tells a user to): `vllm bench serve` against a CPU vLLM
server under `tica leg run` (one crossed round, both arms), `lm_eval --model hf` on the tiny
model under `tica leg run` and ingested, verl's per-step metrics as its file logger and its MLflow
logger store them, ingested. The folder (with its `replay.yaml`), a candidate manifest for the
tiny model and frozen questions are judged by the real Dagster job (`python -m tica_assets.demo
--tracks mytrack`, TICA_REPLAY=mytrack=FOLDER), and the verdicts are read where a user reads them:
`tica ledger query` on `track_verdicts` and the report asset's metadata.

What must hold: every format gives a verdict cell with its reasons; what a tool did not record is
listed as unknown; nothing passes that cannot (a CPU BI=1 vLLM server has no batch invariance, so
its bench arm fails; the hf lm_eval "bi1" run only had VLLM_BATCH_INVARIANT=1 in its environment).
Negative control: an ingested leg edited after sealing is named in the report, never accepted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.legs import walkthrough_project as W
from tests.legs.test_ingest_lm_eval import _question as quality_question
from tica.evidence import EvidenceItem
from tica.judges import judge_criteria
from tica.items.quality.judge import judge_quality
from tica.items.throughput.judge import check_workload
from tica.question import ThroughputCriteria, parse_question
from tica.receipts import load_bench_leg
from tica.seal import check_seal
from tica.verdict import Verdict

# who may have written a judged leg.json: the tools' own producers, never this test
PRODUCERS = {"tica leg run", "lm_eval", "verl"}
CLEAN_EXIT = parse_question({
    "name": "leg-run-clean-exit", "item": "clean_exit", "compared": "x", "computation": "x", "pass_line": "x",
    "noise_floor": 0.0, "repeats": 1, "pairing_order": ["AB"], "invalid_leg_rule": "none",
    "criteria": {"item": "clean_exit", "required_roles": ["client", "api_server", "engine_core", "worker"]}})


def _ledger_query(env: dict, sql: str) -> list[dict]:
    run = subprocess.run([str(W.BIN / "tica"), "ledger", "query", sql, "--json"], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    return [dict(zip(data["columns"], row)) for row in data["rows"]]


def _materializations(home: Path):
    from dagster import DagsterInstance

    from tica_assets.keys import evidence_key, report_key

    instance = DagsterInstance.from_config(str(home))
    evidence = {i.value: instance.get_latest_materialization_event(evidence_key(W.TRACK, i)).asset_materialization.metadata
                for i in EvidenceItem}
    report = instance.get_latest_materialization_event(report_key(W.TRACK)).asset_materialization.metadata
    return instance, evidence, report


@pytest.mark.slow
def test_runs_you_already_have_are_judged_together_in_the_tracks_report(tiny_model, tmp_path, monkeypatch):
    t0 = time.time()
    folder = tmp_path / "runs" / W.TRACK  # what TICA_REPLAY names for the track
    work = tmp_path / "work"  # where the tools wrote their own output
    work.mkdir()

    # ---- the runs, by the real tools, each sealed by `tica leg run` / `tica leg ingest`
    bench = W.bench_legs(folder, tiny_model, work / "bench-results")
    for arm, run in bench.items():
        leg = json.loads(run.stdout)  # --json: one object, the leg
        assert leg["sealed"] and leg["item"] == "throughput", run.stderr[-3000:]
    assert json.loads(bench["bi0"].stdout)["exit"] == 0, bench["bi0"].stderr[-3000:]  # a clean BI=0 leg
    # that BI=0 leg as the judges read it: every process `tica leg run` saw exited on its own under
    # the recipe's shutdown timeout (vLLM's own log of applying it), the workload as asked, no
    # device name invented on a CPU box, the bench's receipt checks clean, the clean-exit cell passes
    bi0_leg = folder / "throughput" / "r1-bi0-c2"
    meta = json.loads((bi0_leg / "leg.json").read_text())
    assert {p["role"] for p in meta["processes"]} == {"client", "api_server", "engine_core", "worker"}
    assert all((p["end_state"], p["exit_code"]) == ("exited", 0) for p in meta["processes"]), meta["processes"]
    cfg = meta["resolved_config"]
    assert (cfg["num_warmups"], cfg["input_len"], cfg["output_len"], cfg["ignore_eos"], cfg["num_prompts"]) == \
        (W.WORKLOAD["warmups"], W.WORKLOAD["input_len"], W.WORKLOAD["output_len"], True, W.WORKLOAD["num_prompts"])
    assert cfg["weights_hash"].startswith("blake3:") and cfg["shutdown_timeout"] == 30
    assert meta["kernels"]["rollout"]["shutdown_timeout"] == 30
    assert "name" not in meta["device"]
    bench_leg = load_bench_leg(bi0_leg)
    criteria = ThroughputCriteria(input_len=W.WORKLOAD["input_len"], output_len=W.WORKLOAD["output_len"],
                                  concurrencies=(W.WORKLOAD["concurrency"],),
                                  num_prompts={W.WORKLOAD["concurrency"]: W.WORKLOAD["num_prompts"]},
                                  warmups=W.WORKLOAD["warmups"])
    assert check_workload(bench_leg, criteria).problems == []
    assert bench_leg.bench.completed == W.WORKLOAD["num_prompts"] and bench_leg.bench.output_throughput > 0
    cell = judge_criteria("clean_exit", CLEAN_EXIT, [bi0_leg])
    assert cell.verdict is Verdict.PASS, cell.reasons
    t_bench = time.time() - t0
    quality = W.lm_eval_legs(folder, tiny_model, work)
    for arm, run in quality.items():
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    W.verl_legs(folder, work)
    (folder / "replay.yaml").write_text(W.REPLAY_YAML)
    W.write_manifest(tmp_path / "candidates", tiny_model)
    W.write_questions(tmp_path / "questions")
    t_legs = time.time() - t0

    # ---- the real Dagster job, as a user runs it
    env = W.project_env(tmp_path, folder)
    demo = subprocess.run([sys.executable, "-m", "tica_assets.demo", "--tracks", W.TRACK, "--models", ""],
                          cwd=W.REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-5000:]
    assert f"{W.TRACK}: run" in demo.stdout and "succeeded" in demo.stdout
    assert f"\n{W.TRACK}: not accepted — 0 of 7 pass; " in demo.stdout  # the answer, first line of its report

    # ---- the verdicts, where a user reads them
    rows = {r["item"]: r for r in _ledger_query(env, f"SELECT * FROM track_verdicts WHERE track='{W.TRACK}'")}
    assert set(rows) == {i.value for i in EvidenceItem}, rows
    home = Path(env["DAGSTER_HOME"])
    instance, evidence, report = _materializations(home)
    reasons = {item: meta["reasons"].value for item, meta in evidence.items()}
    for item, row in rows.items():
        assert row["verdict"] == evidence[item]["verdict"].value  # the ledger and the asset agree
        assert report[f"cell: {item}"].value  # every item shows in the report
        assert reasons[item].startswith("- "), (item, reasons[item])  # a cell with its reasons

    # nothing passes, nothing is accepted: these runs cannot support a pass
    assert not [i for i, r in rows.items() if r["verdict"] == "pass"], rows
    assert report["acceptance"].value.startswith("not accepted")
    judged = {"forward", "quality", "throughput", "clean_exit", "artifacts"}
    assert {i for i, r in rows.items() if r["after_the_fact"]} == judged  # recorded before the questions were frozen
    assert set(report["after_the_fact"].value.split(", ")) == judged
    assert rows["backward"]["verdict"] == rows["update"]["verdict"] == "not run"  # no legs named: nothing invented

    # every judged leg was sealed by a tool, reads as sealed, and is one replay.yaml names
    legs = _ledger_query(env, "SELECT DISTINCT leg_dir, item, status FROM legs")
    assert {Path(r["leg_dir"]).relative_to(folder).as_posix() for r in legs} == {
        "throughput/r1-bi1-c2", "throughput/r1-bi0-c2", "quality/bi1", "quality/bi0",
        "forward/file-bi1", "forward/file-bi0", "forward/mlflow-bi1", "forward/mlflow-bi0"}
    for r in legs:
        meta = json.loads((Path(r["leg_dir"]) / "leg.json").read_text())
        assert meta["producer"] in PRODUCERS and r["status"] == "sealed", (r, meta["producer"])
        assert check_seal(Path(r["leg_dir"])) == []

    # throughput (`vllm bench serve` under `tica leg run`): the CPU BI=1 server has no batch
    # invariance: its requests failed, the round is invalid, no loss is computed, nothing passes
    assert rows["throughput"]["verdict"] != "pass"
    assert "completed 0 of 4 requests" in reasons["throughput"] and "0 valid round(s)" in reasons["throughput"]
    assert "device.name not recorded (unknown)" in reasons["throughput"]  # no nvidia-smi: no name invented
    assert "workload_receipts" in rows["throughput"]["checks"]

    # quality (lm_eval hf, ingested): the bi1 run only had the switch in its environment; lm_eval
    # records no device, versions, kernels or weights hash: listed unknown, never a pass
    assert rows["quality"]["verdict"] != "pass"
    assert "N=8" in rows["quality"]["summary"]
    assert any("not recorded (unknown)" in r and "device.name" in r and "kernels" in r and "bi1" in r
               for r in reasons["quality"].splitlines()), reasons["quality"]
    run_bi1 = json.loads((folder / "quality" / "lm_eval-run-bi1" / "leg.json").read_text())
    assert run_bi1["env"]["VLLM_BATCH_INVARIANT"] == "1"  # all the hf "bi1" run had
    ingested = json.loads((folder / "quality" / "bi1" / "leg.json").read_text())
    assert not ingested.get("env") and not ingested.get("device") and not ingested.get("kernels")  # not invented
    # the same pair as `tica judge quality` reads it (docs/leg-run.md's lm_eval walkthrough, whose
    # commands these runs are): each `tica leg run` recorded its arm's switch, identical lm_eval
    # runs differ in no contract item, and what lm_eval does not record is unknown, never a pass
    for arm in ("bi0", "bi1"):
        run_leg = json.loads((folder / "quality" / f"lm_eval-run-{arm}" / "leg.json").read_text())
        assert run_leg["env"]["VLLM_BATCH_INVARIANT"] == ("1" if arm == "bi1" else "0")
    cell = judge_quality(quality_question(W.LIMIT), [folder / "quality" / "bi0", folder / "quality" / "bi1"])
    assert cell.numbers["n"] == W.LIMIT and cell.numbers["contract_differs"] == []
    assert any("not recorded (unknown)" in r and "device.name" in r for r in cell.reasons), cell.reasons
    assert cell.verdict is not Verdict.PASS

    # forward (verl's file logger, then its MLflow store as a second run): each judged, with unknowns
    verdicts = _ledger_query(env, "SELECT verdict_id, verdict, rerun_of FROM verdicts WHERE item = 'forward' ORDER BY seq")
    assert len(verdicts) == 2 and verdicts[1]["rerun_of"] == verdicts[0]["verdict_id"]
    assert rows["forward"]["verdict_id"] == verdicts[1]["verdict_id"] and rows["forward"]["verdict"] != "pass"
    earlier = evidence["forward"]["earlier_runs"].value
    assert earlier.startswith("- verl-file-logger: inconclusive"), earlier
    assert "unknown: step_basis, checkpoint_version" in reasons["forward"]
    assert "mlflow-bi1" in reasons["forward"]
    for leg in ("file-bi1", "mlflow-bi1"):
        meta = json.loads((folder / "forward" / leg / "leg.json").read_text())
        assert meta["producer"] == "verl" and meta["producer_version"] is None  # verl tags no version: unknown

    # clean exit: the BI=1 server did not exit cleanly; ingested legs record no exits (unknown)
    assert rows["clean_exit"]["verdict"] == "fail"
    # (which of its processes was signalled varies with how the failed engine shut down)
    assert any(r.startswith("- fail: server: throughput bi1 r1-bi1-c2") for r in reasons["clean_exit"].splitlines())
    assert "quality bi1 bi1: no exit receipt (processes is empty)" in reasons["clean_exit"]
    # artifacts: the ingested legs record no weights hash
    assert rows["artifacts"]["verdict"] != "pass"
    assert "bi1: resolved_config.weights_hash not recorded" in reasons["artifacts"]
    t_judged = time.time() - t0

    # ---- negative control: an ingested leg edited after sealing (BI=1 made to look bitwise equal)
    edited = folder / "forward" / "mlflow-bi0" / "metrics.jsonl"
    edited.write_text(edited.read_text().replace("0.02", "0.0"))
    assert check_seal(edited.parent)  # the seal no longer matches
    from tests.dagster.dagster_helpers import build_defs, materialize_track
    from tica_assets.keys import evidence_key
    from tica_assets.settings import Settings

    monkeypatch.setenv("TICA_CACHE_DIR", env["TICA_CACHE_DIR"])
    defs = build_defs(Settings.from_env(env))
    forward = materialize_track(defs, instance, W.TRACK, keys=[evidence_key(W.TRACK, EvidenceItem.FORWARD)])
    assert not forward.success  # the blocking receipts check failed
    assert materialize_track(defs, instance, W.TRACK, job="report").success
    _, evidence, report = _materializations(home)
    broken = "mlflow-bi0/metrics.jsonl: changed after sealing"
    assert "check receipts_sealed failed" in report["cell: forward"].value and broken in report["cell: forward"].value
    assert report["acceptance"].value.startswith("not accepted") and "receipts_sealed" in report["acceptance"].value
    row = _ledger_query(env, f"SELECT * FROM track_verdicts WHERE track='{W.TRACK}' AND item='forward'")[0]
    assert "receipts_sealed" in row["failed_checks"] and row["verdict"] != "pass"
    assert broken in evidence["forward"]["reasons"].value  # the judge names it too
    print(f"[walkthrough] bench {t_bench:.0f} s, all legs {t_legs:.0f} s, judged {t_judged:.0f} s, "
          f"total {time.time() - t0:.0f} s")
