"""`tica leg ingest`: results already on disk, wrapped as sealed legs (docs/receipts.md, "Ingest").

The sources, each as its producer writes it:

- bench: a `vllm bench serve --save-result` JSON -> a throughput leg; bench.json is the file's
  bytes unchanged.
- verl-metrics: verl's file logger (one JSON object per line: `step` and metric keys such as
  `training/rollout_probs_diff_max`, `actor/grad_norm`) -> a forward leg's metrics.jsonl.
- verl-mlflow: the same metrics from an MLflow file store (`mlruns/<exp>/<run>/metrics/<key>`, one
  `timestamp value step` line per value) -> the same forward leg; the run's params as
  resolved_config.mlflow_params (verl logs its config there), source.json the sha256 of each file read.
- verl-wandb: the same metrics from a W&B run-history export (JSONL, JSON or CSV rows holding
  `_step`) -> the same forward leg. Formats: tica/ingest_trackers.py.
- problems: per-problem JSONL (problem_id, correct, ...) -> a quality leg's results.jsonl, with
  contract.json only when one is given.
- lm-eval: an `lm_eval --log_samples` output (results_<date>.json beside samples_<task>_<date>.jsonl)
  -> a quality leg: per doc a result, correct from the task's first metric; contract.json with the
  items the results JSON records (a partial contract: what it does not record stays unknown).

Unknown is a value, never an invention: a field the source does not record is absent from the leg
(None, an empty mapping), and the judge, reading the question, decides which unknowns leave a
cell inconclusive and lists them. The arm is always given, never guessed; a source that states
another arm, round, slot or concurrency than the flags is refused. Every leg holds `source.json`
(the original path and its sha256) and is sealed. Bad input raises InputError naming the file
and field, and nothing is written: the leg is built in a temporary directory beside --out and
renamed into place at the end.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tica import strict_io
from tica.errors import InputError, field_line, input_bytes, pydantic_errors
from tica.ingest_trackers import mlflow_version_tag, read_mlflow_run, read_wandb_history
from tica.metrics import VERL_FORWARD_KEYS
from tica.receipts import (BENCH_FILE, CONTRACT_FILE, LEG_FILE, METRICS_FILE, RESULTS_FILE, ForwardStep, LegMeta,
                           ProblemResult, RecordedEvalContract, validate_receipt, load_bench, load_json,
                           load_jsonl, load_quality_results, load_step_metrics)
from tica.progress import Progress
from tica.seal import seal_leg, sha256_file

SOURCE_FILE = "source.json"
BENCH_PRODUCER = "vllm bench serve"
VERL_PRODUCER = "verl"
# Where a vLLM result JSON may state the version that wrote it (none of the committed ones does).
# A plain `version` is no such statement: it is a --metadata label (vLLM's own --metadata example
# is `version=0.3.3 tp=1`), kept as resolved_config.metadata.version, never taken as vLLM's version.
_VERSION_KEYS = ("vllm_version",)
_LABEL_KEYS = ("version",)
# Workload fields a bench JSON may carry as --metadata strings; read as the judge compares them.
_INT_FIELDS = ("input_len", "output_len")

ARMS = ("bi1", "bi0")


def _raw(path: Path) -> bytes:
    return input_bytes(path)


def _agree(path: Path, field: str, stated: Any, given: Any, flag: str) -> Any:
    """The value the source states and the flag gives: one of them, or refused if they differ."""
    if stated is not None and given is not None and stated != given:
        raise InputError(path, field, f"{stated!r} but {flag} says {given!r}")
    return given if given is not None else stated


def _meta(path: Path, item: str, arm: str, producer: str | None, producer_version: str | None,
          **fields: Any) -> dict[str, Any]:
    if arm not in ARMS:
        raise InputError("<command line>", "--arm", f"{arm!r}: one of {', '.join(ARMS)} (never guessed)")
    meta = {"schema": "tica.leg/1", "item": item, "arm": arm, "producer": producer,
            "producer_version": producer_version, **{k: v for k, v in fields.items() if v is not None}}
    try:
        LegMeta.model_validate(meta)
    except ValueError as err:
        raise InputError(path, "leg.json", f"the leg it would make is not valid: {err}") from None
    return meta


def _source_note(source: Path, files: list[Path] | None) -> dict[str, Any]:
    """Where the leg's data came from: a file and its sha256, or a folder and the sha256 of each
    file read from it."""
    if files is None:
        return {"path": str(source.resolve()), "sha256": "sha256:" + sha256_file(source)}
    with Progress(f"hash {source}", len(files)) as bar:
        table = {}
        for f in files:
            table[f.relative_to(source).as_posix()] = "sha256:" + sha256_file(f)
            bar.update()
    return {"path": str(source.resolve()), "files": table}


def _write_leg(out: Path, source: Path, kind: str, files: dict[str, bytes], source_files: list[Path] | None = None,
               **note_extra: Any) -> Path:
    """Write files (leg.json among them) and source.json into a new leg at `out`, seal it, and
    rename it into place; nothing is left behind on error. `source_files`: the files read from a
    source folder (else `source` is the one file read)."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(out, "--out", "exists and is not an empty directory: a leg is written once")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.ingest-", dir=out.parent))
    try:
        note = {"kind": kind, **_source_note(source, source_files), **note_extra}
        for name, data in {**files, SOURCE_FILE: json.dumps(note, indent=1).encode()}.items():
            (tmp / name).write_bytes(data)
        seal_leg(tmp)
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _json_bytes(data: Any) -> bytes:
    return (json.dumps(data, indent=1) + "\n").encode()


def _jsonl_bytes(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows).encode()


def ingest_bench(path: str | Path, out: str | Path, arm: str, round: int | None = None, slot: int | None = None,
                 concurrency: int | None = None) -> Path:
    """A raw `vllm bench serve --save-result` JSON as a sealed throughput leg."""
    path = Path(path)
    raw = _raw(path)
    bench = load_bench(path)  # ReceiptError (an InputError) names the field
    data = strict_io.loads(strict_io.text_of(raw))
    _agree(path, "arm", bench.arm, arm, "--arm")
    round_ = _agree(path, "round", bench.round, round, "--round")
    slot_ = _agree(path, "slot", bench.slot, slot, "--slot")
    conc = _agree(path, "max_concurrency", bench.max_concurrency, concurrency, "--concurrency")
    version = next((str(data[k]) for k in _VERSION_KEYS if isinstance(data.get(k), (str, int, float))
                    and str(data[k])), None)
    config: dict[str, Any] = {"num_prompts": bench.num_prompts}
    if bench.num_warmups is not None:
        config["num_warmups"] = bench.num_warmups
    if bench.ignore_eos is not None:
        config["ignore_eos"] = bench.ignore_eos
    for key in _INT_FIELDS:
        v = data.get(key)
        if isinstance(v, str) and v.strip().isdigit():
            v = int(v)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int):
                raise InputError(path, key, f"{v!r} is not a whole number of tokens")
            config[key] = v
    for key in ("model_id", "tokenizer_id", "backend", "endpoint_type", "request_rate"):
        if data.get(key) is not None:
            config[key] = data[key]
    labels = {k: data[k] for k in _LABEL_KEYS if data.get(k) is not None}
    if labels:
        config["metadata"] = labels
    # The node the run measured, where the file says (`--metadata node=...`); else unknown, and the
    # throughput judge does not take the pairing for one on a single node.
    node = data.get("node")
    if node is not None:
        if not isinstance(node, str) or not node.strip():
            raise InputError(path, "node", f"{node!r} is not a node's name")
        config["node"] = node
    # profiled: as the file records it; absent, it stays absent (unknown), never written as false.
    meta = _meta(path, "throughput", arm, BENCH_PRODUCER, version, round=round_, slot=slot_, concurrency=conc,
                 versions={"vllm": version} if version else None, resolved_config=config,
                 profiled=bench.profiled)
    return _write_leg(Path(out), path, "vllm bench serve --save-result", {LEG_FILE: _json_bytes(meta), BENCH_FILE: raw})


def _steps_file(path: Path, rows: list[dict[str, Any]], model: type) -> bytes:
    """Rows as a metrics.jsonl, checked as the judge will read it (a bad row names its line)."""
    data = _jsonl_bytes(rows)
    with tempfile.TemporaryDirectory() as d:
        probe = Path(d) / METRICS_FILE
        probe.write_bytes(data)
        try:
            load_step_metrics(probe, model)
        except InputError as err:
            raise InputError(path, err.field, err.message) from None
    return data


def _forward_leg(path: Path, unit: str, rows: list[tuple[int, dict[str, Any]]], out: str | Path, arm: str,
                 producer_version: str | None, kind: str, source_files: list[Path] | None = None,
                 resolved_config: dict[str, Any] | None = None, **note: Any) -> Path:
    """verl rows, each numbered where the source holds it (`unit` "line": (3, row) is line 3), as
    a sealed forward leg. A row holding no forward metric (validation at step 0) is left out and
    listed in source.json (`lines_without_forward_metrics`: [1])."""
    kept, skipped = [], []
    for n, row in rows:
        if not any(k in row for k in VERL_FORWARD_KEYS):
            skipped.append(n)
            continue
        validate_receipt(ForwardStep, row, path, f"{unit} {n}")  # a bad row is named by where the source holds it
        kept.append(row)
    if not kept:
        raise InputError(path, "<file>", f"no step holds a forward metric ({', '.join(VERL_FORWARD_KEYS)})")
    data = _steps_file(path, kept, ForwardStep)
    meta = _meta(path, "forward", arm, VERL_PRODUCER, producer_version, resolved_config=resolved_config)
    return _write_leg(Path(out), path, kind, {LEG_FILE: _json_bytes(meta), METRICS_FILE: data},
                      source_files=source_files, **note, **{f"{unit}s_without_forward_metrics": skipped})


def _verl_file_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    for n, row in enumerate(load_jsonl(path), 1):
        if "step" not in row:
            raise InputError(path, f"line {n}.step", "missing: verl's file logger writes the step on every line")
        if isinstance(row.get("data"), dict) and set(row) == {"step", "data"}:
            row = {"step": row["step"], **row["data"]}  # verl's FileLogger: {"step": S, "data": {metric: value}}
        rows.append((n, row))
    return rows


def ingest_verl_metrics(path: str | Path, out: str | Path, arm: str, producer_version: str | None = None) -> Path:
    """verl's per-step metrics (its JSONL file logger) as a sealed forward leg. step_basis and
    checkpoint_version are unknown (verl writes neither) unless a row states them."""
    path = Path(path)
    _raw(path)
    return _forward_leg(path, "line", _verl_file_rows(path), out, arm, producer_version, "verl file logger (JSONL)")


def ingest_verl_mlflow(path: str | Path, out: str | Path, arm: str, run_id: str | None = None,
                       producer_version: str | None = None) -> Path:
    """verl's per-step metrics from an MLflow file store (a run, experiment or mlruns folder) as a
    sealed forward leg, as `ingest_verl_metrics` makes it. The verl version is the run's
    `verl_version` tag if it has one (verl sets none), else --producer-version, else unknown."""
    run = read_mlflow_run(Path(path), run_id)
    stated = mlflow_version_tag(run)
    version = _agree(run.run_dir / stated[0], "value", stated[1], producer_version, "--producer-version") \
        if stated else producer_version
    config = {"mlflow_params": run.params} if run.params else None  # verl logs its config as params
    return _forward_leg(run.run_dir, "step", list(run.rows.items()), out, arm, version, "verl MLflow logger (file store)",
                        source_files=run.files, resolved_config=config, run_id=run.meta["run_id"],
                        experiment_id=run.meta.get("experiment_id"), run_name=run.meta.get("run_name"),
                        producer_version_from=stated[0] if stated else None)


def ingest_verl_wandb(path: str | Path, out: str | Path, arm: str, producer_version: str | None = None) -> Path:
    """verl's per-step metrics from a W&B run-history export (.jsonl, .json, .csv) as a sealed
    forward leg, as `ingest_verl_metrics` makes it; the verl version is unknown unless given."""
    path = Path(path)
    unit = "row" if path.suffix.lower() == ".json" else "line"
    return _forward_leg(path, unit, read_wandb_history(path), out, arm, producer_version,
                        f"W&B run history ({path.suffix.lstrip('.')})")


def ingest_problems(path: str | Path, out: str | Path, arm: str, contract: str | Path | None = None,
                    producer: str | None = None, producer_version: str | None = None) -> Path:
    """Per-problem JSONL as a sealed quality leg; the evaluation contract is unknown unless given."""
    path = Path(path)
    raw = _raw(path)
    results = load_quality_results(path)
    if not results:
        raise InputError(path, "<file>", "no problems: an empty results file is no measurement")
    ids = [r.problem_id for r in results]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise InputError(path, "problem_id", f"{dup[0]!r} appears twice")
    files = {RESULTS_FILE: raw}
    if contract is not None:
        contract = Path(contract)
        validate_receipt(RecordedEvalContract, load_json(contract), contract)
        files[CONTRACT_FILE] = _raw(contract)
    meta = _meta(path, "quality", arm, producer, producer_version)
    return _write_leg(Path(out), path, "per-problem JSONL", {LEG_FILE: _json_bytes(meta), **files})


# ---------------------------------------------------------------- lm_eval --log_samples

LM_EVAL_PRODUCER = "lm_eval"
# Doc fields that name a problem (the doc's own id); else lm_eval's doc_id (its row in the split).
_DOC_ID_KEYS = ("problem_id", "id")


class _LmEvalFilter(BaseModel):
    """One entry of configs.<task>.filter_list: lm_eval names each filter (the samples' `filter`)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str


class _LmEvalTask(BaseModel):
    """configs.<task>: the parts read, each of the shape lm_eval writes (other keys are kept as they are)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    generation_kwargs: dict[str, Any] | None = None
    filter_list: list[_LmEvalFilter] | None = None


class _LmEvalRun(BaseModel):
    """`config`: how lm_eval was run. model_args and gen_kwargs are mappings in lm_eval 0.4, the
    command-line string in older versions (not parsed here)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    model: str | None = None
    model_args: dict[str, Any] | str | None = None
    gen_kwargs: dict[str, Any] | str | None = None


class _LmEvalResults(BaseModel):
    """The structure of an `lm_eval` results JSON that ingest reads, checked before any of it is
    read: a field of another shape is bad input naming the file and the field (exit 4), never a
    traceback. Only the task ingested is checked under `configs`."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    configs: dict[str, _LmEvalTask] = Field(..., min_length=1)
    versions: dict[str, Any] | None = None
    n_shot: dict[str, Any] | None = Field(None, alias="n-shot")
    task_hashes: dict[str, Any] | None = None
    config: _LmEvalRun | None = None


def _lm_eval_results(results: Path, task: str) -> dict[str, Any]:
    """The results JSON, its structure checked for `task` (InputError naming the field)."""
    data = load_json(results)
    checked = {**data, "configs": {task: data["configs"][task]}}
    try:
        _LmEvalResults.model_validate(checked)
    except ValidationError as err:
        raise _shape_error(results, checked, err) from None
    return data


# pydantic's error types for a value of the wrong shape, as the results JSON's reader says them.
_SHAPES = {"model_type": "an object", "dict_type": "an object", "list_type": "an array", "string_type": "a string"}


def _file_loc(data: Any, loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """pydantic's error location without its union tags (a member's type name): the path in the file."""
    out, node = [], data
    for part in loc:
        if (isinstance(node, dict) and part in node) or (isinstance(node, list) and type(part) is int
                                                         and 0 <= part < len(node)):
            out.append(part)
            node = node[part]
    return tuple(out)


def _shape_error(results: Path, checked: dict[str, Any], err: ValidationError) -> InputError:
    """The first refused field, named by its path in the file: "configs.T.filter_list: a number 5,
    but lm_eval writes an array here" (every shape a union allows listed)."""
    items = err.errors()
    loc = _file_loc(checked, tuple(items[0]["loc"]))
    same = [e for e in items if _file_loc(checked, tuple(e["loc"])) == loc]
    shapes = [_SHAPES.get(e["type"]) for e in same]
    if not all(shapes):
        return pydantic_errors(InputError, results, err)
    field = ".".join(str(p) for p in loc) or "<root>"
    more = f" (and {len(items) - len(same)} more)" if len(items) > len(same) else ""
    refused = same[0]["input"]
    return InputError(results, field, f"{_json_type(refused)}, but lm_eval writes {' or '.join(dict.fromkeys(shapes))} "
                      f"here{more}", line=field_line(results, loc, refused))


def _json_type(value: Any) -> str:
    """A JSON value's kind as a reader of the file sees it: `a string "x"`, `a number 5`, `an array`."""
    if value is None:
        return "null"
    kind = ("a boolean" if isinstance(value, bool) else "a number" if isinstance(value, (int, float))
            else "a string" if isinstance(value, str) else "an array" if isinstance(value, list) else "an object")
    return kind if isinstance(value, (dict, list)) else f"{kind} {json.dumps(value)[:60]}"


def _lm_eval_files(path: Path, task: str | None) -> tuple[Path, str, Path]:
    """(results JSON, task, samples JSONL) from an `lm_eval --output_path` folder (or the model
    folder under it, or a results_*.json itself); refused when not exactly one fits."""
    if path.is_file():
        candidates = [path]
    elif path.is_dir():
        candidates = sorted(path.rglob("results_*.json"))
    else:
        raise InputError(path, "<file>", "no such file or directory")
    if task is not None:
        candidates = [c for c in candidates if isinstance(cfgs := load_json(c).get("configs"), dict) and task in cfgs]
    if len(candidates) != 1:
        what = f" for task {task!r}" if task else ""
        raise InputError(path, "results_*.json", f"{len(candidates)} lm_eval results files{what} "
                         f"({', '.join(c.name for c in candidates) or 'none'}): name one file or --task")
    results = candidates[0]
    configs = load_json(results).get("configs")
    if not isinstance(configs, dict) or not configs:
        raise InputError(results, "configs", "missing: not an lm_eval results file")
    if task is None:
        if len(configs) != 1:
            raise InputError(results, "configs", f"{len(configs)} tasks ({', '.join(sorted(configs))}): name one with --task")
        task = next(iter(configs))
    elif task not in configs:
        raise InputError(results, "configs", f"no task {task!r} (it holds {', '.join(sorted(configs))})")
    stamp = results.name[len("results_"):-len(".json")] if results.name.startswith("results_") else None
    samples = results.parent / f"samples_{task}_{stamp}.jsonl" if stamp else None
    if samples is None or not samples.is_file():
        found = sorted(results.parent.glob(f"samples_{task}_*.jsonl"))
        if len(found) != 1:
            raise InputError(results.parent, f"samples_{task}_*.jsonl",
                             f"{len(found)} samples files beside {results.name}: run lm_eval with --log_samples")
        samples = found[0]
    return results, task, samples


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _lm_eval_contract(data: dict[str, Any], task: str) -> tuple[dict[str, Any], list[str]]:
    """The contract items an lm_eval results JSON records for `task`, and the fields left unknown.
    Each item is built only from keys the file holds; an item any of whose parts is absent is left
    out (unknown), never filled with lm_eval's or TICA's default."""
    cfg = data["configs"][task]
    run = data.get("config") if isinstance(data.get("config"), dict) else {}
    contract: dict[str, Any] = {}
    unknown: list[str] = []
    version = (data.get("versions") or {}).get(task)
    task_hash = (data.get("task_hashes") or {}).get(task)
    # dataset: the task and its version, where the data came from, and lm_eval's hash over every
    # doc, prompt and target it scored (written with --log_samples).
    if version is not None and cfg.get("dataset_path") and task_hash:
        contract["dataset_version"] = _canonical({
            "task": task, "version": version, "dataset_path": cfg["dataset_path"],
            "dataset_name": cfg.get("dataset_name"), "dataset_kwargs": cfg.get("dataset_kwargs"),
            "split": cfg.get("test_split") or cfg.get("validation_split"), "task_hash": task_hash})
    else:
        unknown.append("dataset_version (task version, dataset_path or task_hashes not recorded)")
    # prompt: the doc template, few-shot count and layout, and the chat template as lm_eval records
    # it (`chat_template`: null when none was applied; absent: unknown).
    num_fewshot = (data.get("n-shot") or {}).get(task, cfg.get("num_fewshot"))
    chat_keys = ("chat_template", "chat_template_sha", "system_instruction_sha", "fewshot_as_multiturn")
    if cfg.get("doc_to_text") is not None and num_fewshot is not None and "chat_template" in data:
        prompt = {"doc_to_text": cfg["doc_to_text"], "num_fewshot": num_fewshot,
                  **{k: cfg.get(k) for k in ("description", "target_delimiter", "fewshot_delimiter", "gen_prefix")},
                  **{k: data.get(k) for k in chat_keys}}
        if num_fewshot:
            prompt["fewshot_config"] = cfg.get("fewshot_config")
            prompt["fewshot_seed"] = run.get("fewshot_seed")
        contract["prompt_template"] = _canonical(prompt)
    else:
        unknown.append("prompt_template (doc_to_text, n-shot or chat_template not recorded)")
    # thinking: recorded only as the hf model's enable_thinking argument; with no chat template
    # applied there is no thinking switch to set: "none" ("n/a" would read as not recorded).
    model_args = run.get("model_args") if isinstance(run.get("model_args"), dict) else {}
    if "enable_thinking" in model_args:
        contract["thinking_mode"] = "on" if str(model_args["enable_thinking"]).lower() in ("true", "1") else "off"
    elif "chat_template" in data and data["chat_template"] is None:
        contract["thinking_mode"] = "none"
    else:
        unknown.append("thinking_mode (a chat template was applied; enable_thinking not recorded)")
    gen = dict(cfg.get("generation_kwargs") or {})
    cli_gen = run.get("gen_kwargs")
    if isinstance(cli_gen, dict):
        gen.update(cli_gen)  # --gen_kwargs override the task's
    elif cli_gen:
        gen = {}  # a string lm_eval did not parse into the record: not read
    backend = run.get("model") if isinstance(run.get("model"), str) else None
    sampling, why = _lm_eval_sampling(gen, _lm_eval_seed(run, backend), backend)
    if sampling is not None:
        contract["sampling"] = sampling
    else:
        unknown.append(f"sampling ({why})")
    if isinstance(cfg.get("repeats"), int):
        contract["repeats"] = cfg["repeats"]
    else:
        unknown.append("repeats")
    metric_list = cfg.get("metric_list") or []
    if metric_list and data.get("lm_eval_version"):
        contract["scorer"] = _canonical({"lm_eval": data["lm_eval_version"], "metric": metric_list[0],
                                         "filter_list": cfg.get("filter_list")})
    else:
        unknown.append("scorer (metric_list or lm_eval_version not recorded)")
    cap, why = _lm_eval_length_cap(gen, backend, data.get("lm_eval_version"))
    if cap is not None:
        contract["length_cap"] = cap
    else:
        unknown.append(f"length_cap ({why})")
    return contract, unknown


# lm_eval 0.4's backends and where each takes its sampling seed from: hf samples from torch's RNG,
# which lm_eval seeds with --seed's torch_seed; vllm passes model_args' seed to vllm.LLM(seed=...);
# the API backends send model_args' seed with each request. Any other backend: not known here.
_TORCH_SEEDED = ("hf", "huggingface", "hf-auto")
_MODEL_ARGS_SEEDED = ("vllm", "local-completions", "local-chat-completions", "openai-completions",
                      "openai-chat-completions")


def _lm_eval_seed(run: dict[str, Any], backend: str | None) -> int | None:
    """The seed the run's backend sampled with, where the results record it; None (unknown) where
    they do not, or for a backend whose seed TICA does not know where to read."""
    if backend in _TORCH_SEEDED:
        seed: Any = run.get("torch_seed")
    elif backend in _MODEL_ARGS_SEEDED:
        args = run.get("model_args")
        if isinstance(args, str):  # as given on the command line: k=v,k=v
            args = dict(kv.split("=", 1) for kv in args.split(",") if "=" in kv)
        seed = args.get("seed") if isinstance(args, dict) else None
        if isinstance(seed, str) and seed.strip().lstrip("-").isdigit():
            seed = int(seed)
    else:
        seed = None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _lm_eval_sampling(gen: dict[str, Any], seed: int | None, backend: str | None) -> tuple[dict[str, Any] | None, str]:
    """The sampling item as the generation kwargs record it, or None and why it is unknown.

    Greedy only where every lm_eval backend decodes greedily: temperature 0, or no temperature
    and do_sample false. do_sample false beside a temperature above 0 is not greedy everywhere:
    lm_eval's hf and vllm backends then set the temperature to 0, its API backends
    (local-completions, local-chat-completions, openai-*, sglang-generate) and sglang drop
    do_sample and sample at the temperature given: what ran depends on the backend, unknown."""
    stop = gen.get("until")
    stop = [stop] if isinstance(stop, str) else stop
    if "until" not in gen:
        return None, "generation_kwargs.until (the stop sequences) not recorded"
    if not isinstance(stop, list) or not all(isinstance(x, str) for x in stop):
        return None, f"generation_kwargs.until is {gen['until']!r}, not a stop sequence or a list of them"
    temperature, do_sample = gen.get("temperature"), gen.get("do_sample")
    if "temperature" in gen and not _number(temperature):
        return None, f"generation_kwargs.temperature is {temperature!r}, not a number"
    if ("temperature" in gen and temperature == 0) or ("temperature" not in gen and do_sample is False):
        # greedy decoding: top_p / top_k are not read, so their values do not change the output.
        return {"temperature": 0.0, "seed": seed, "n": 1, "stop": stop}, ""
    if do_sample is False:
        return None, (f"generation_kwargs record do_sample: false with temperature {temperature!r}: what ran depends "
                      f"on the backend ({backend or 'not recorded'}): lm_eval's hf and vllm backends decode greedily, "
                      "its API and sglang backends sample at that temperature")
    if "temperature" in gen and all(k in gen for k in ("top_p", "top_k")):
        return {"temperature": temperature, "top_p": gen["top_p"], "top_k": gen["top_k"],
                "seed": seed, "n": 1, "stop": stop}, ""
    return None, "generation_kwargs record neither greedy decoding nor temperature, top_p, top_k and until"


# The generation kwargs lm_eval reads as the number of tokens to generate (lm_eval.models.utils.
# normalize_gen_kwargs lists them), and which of them each backend of lm_eval 0.4.13 reads, first
# wins: hf and vllm normalize all four (max_gen_toks first); the API backends send `max_tokens`,
# else `max_gen_toks` (openai_completions.py, sglang_generate_API.py); sglang and every other
# backend read `max_gen_toks` only. Another lm_eval version: only `max_gen_toks`, which all read.
_LENGTH_ALIASES = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")
_LENGTH_READ_VERSION = "0.4.13"
_API_BACKENDS = ("local-completions", "local-chat-completions", "openai-completions", "openai-chat-completions",
                 "azure-openai-chat-completions", "sglang-generate")
_NORMALIZING_BACKENDS = ("hf", "hf-auto", "huggingface", "vllm")


def _length_aliases_read(backend: str | None, lm_eval_version: Any) -> tuple[str, ...]:
    if lm_eval_version == _LENGTH_READ_VERSION and backend in _API_BACKENDS:
        return ("max_tokens", "max_gen_toks")
    if lm_eval_version == _LENGTH_READ_VERSION and backend in _NORMALIZING_BACKENDS:
        return _LENGTH_ALIASES
    return ("max_gen_toks",)


def _lm_eval_length_cap(gen: dict[str, Any], backend: str | None, lm_eval_version: Any) -> tuple[int | None, str]:
    """The length cap as the recorded backend reads it, or None and why it is unknown: none of
    its aliases recorded (the backend's default applied, not recorded), one that is no whole
    number, several that disagree, or only aliases the backend does not read."""
    present = {k: gen[k] for k in _LENGTH_ALIASES if k in gen}
    if not present:
        return None, (f"generation_kwargs record none of {', '.join(_LENGTH_ALIASES)}; "
                      "lm_eval's model default applied, not recorded")
    bad = next((k for k, v in present.items() if isinstance(v, bool) or not isinstance(v, int)), None)
    if bad is not None:
        return None, f"generation_kwargs.{bad} is {present[bad]!r}, not a whole number of tokens"
    if len(set(present.values())) > 1:
        listed = ", ".join(f"{k} {v}" for k, v in present.items())
        return None, f"generation_kwargs record {listed}, which disagree: which one ran depends on the backend"
    read = _length_aliases_read(backend, lm_eval_version)
    if not any(k in present for k in read):
        return None, (f"generation_kwargs record {', '.join(present)}, which the backend ({backend or 'not recorded'}, "
                      f"lm_eval {lm_eval_version or 'version not recorded'}) is not known to read "
                      f"(it reads {', '.join(read)}): its default may have applied")
    return next(iter(present.values())), ""


def _lm_eval_correct(samples: Path, n: int, row: dict[str, Any], metric: str) -> bool:
    value = row.get(metric)
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return value == 1
    raise InputError(samples, f"line {n}.{metric}",
                     f"{value!r}: the task's metric must be 0 or 1 per doc to read it as correct")


def ingest_lm_eval(path: str | Path, out: str | Path, arm: str, task: str | None = None) -> Path:
    """An `lm_eval --log_samples` output as a sealed quality leg (docs/leg-run.md)."""
    path = Path(path)
    results_file, task, samples_file = _lm_eval_files(path, task)
    data = _lm_eval_results(results_file, task)
    cfg = data["configs"][task]
    metric_list = cfg.get("metric_list")
    if not isinstance(metric_list, list) or not metric_list or not isinstance(metric_list[0], dict) \
            or not isinstance(metric_list[0].get("metric"), str):
        raise InputError(results_file, f"configs.{task}.metric_list", "missing: the metric that scores each doc")
    metric = metric_list[0]["metric"]
    filters = [f.get("name") for f in cfg.get("filter_list") or [] if isinstance(f, dict)]
    rows = load_jsonl(samples_file)  # a line that is not a JSON object names its line
    chosen = filters[0] if filters else None
    results: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    id_key = None
    for n, row in enumerate(rows, 1):
        if chosen is not None and row.get("filter", chosen) != chosen:
            continue  # the same doc under another filter: the first filter of filter_list is read
        doc = row.get("doc")
        if not isinstance(doc, dict) or "doc_id" not in row:
            raise InputError(samples_file, f"line {n}", "needs doc_id and doc (an lm_eval --log_samples line)")
        key = next((k for k in _DOC_ID_KEYS if isinstance(doc.get(k), (str, int)) and str(doc[k])), None)
        id_key = id_key or key or "doc_id"
        if (key or "doc_id") != id_key:
            raise InputError(samples_file, f"line {n}.doc", f"no {id_key} where earlier docs have one")
        pid = str(doc[key]) if key else str(row["doc_id"])
        if pid in seen:
            raise InputError(samples_file, f"line {n}", f"problem {pid!r} again (first on line {seen[pid]})")
        seen[pid] = n
        result: dict[str, Any] = {"problem_id": pid, "correct": _lm_eval_correct(samples_file, n, row, metric),
                                  "doc_id": row["doc_id"]}
        if isinstance(row.get("prompt_hash"), str):
            result["prompt_hash"] = "sha256:" + row["prompt_hash"]  # lm_eval: sha256 of the prompt text
        resps = row.get("resps")
        if isinstance(resps, list) and resps and isinstance(resps[0], list) and resps[0] and isinstance(resps[0][0], str):
            result["response"] = resps[0][0]
        filtered = row.get("filtered_resps")
        if isinstance(filtered, list) and filtered and isinstance(filtered[0], str):
            result["extracted"] = filtered[0]
        # truncated: lm_eval does not record whether max_gen_toks cut the answer: unknown.
        validate_receipt(ProblemResult, result, samples_file, f"line {n}")
        results.append(result)
    if not results:
        raise InputError(samples_file, "<file>", "no docs: an empty samples file is no measurement")
    contract, unknown = _lm_eval_contract(data, task)
    try:
        RecordedEvalContract.model_validate(contract)
    except ValueError as err:
        raise InputError(results_file, f"configs.{task}", f"the contract it records is not valid: {err}") from None
    files = {RESULTS_FILE: _jsonl_bytes(results)}
    if contract:
        files[CONTRACT_FILE] = _json_bytes(contract)
    run = data.get("config") if isinstance(data.get("config"), dict) else {}
    version = data.get("lm_eval_version") if isinstance(data.get("lm_eval_version"), str) else None
    versions = {k: data[v] for k, v in (("lm_eval", "lm_eval_version"), ("transformers", "transformers_version"))
                if isinstance(data.get(v), str)}
    config = {k: run[k] for k in ("model", "model_args", "limit", "batch_size", "device", "model_dtype")
              if run.get(k) is not None}
    meta = _meta(results_file, "quality", arm, LM_EVAL_PRODUCER, version, versions=versions or None,
                 resolved_config={"lm_eval": {**config, "task": task}})
    return _write_leg(Path(out), samples_file, "lm_eval --log_samples", {LEG_FILE: _json_bytes(meta), **files},
                      task=task, metric=metric, filter=chosen, problem_id_from=id_key,
                      results_json={"path": str(results_file.resolve()), "sha256": "sha256:" + sha256_file(results_file)},
                      contract_unknown=unknown)


# What a bench JSON may leave out that the throughput judge compares (read from resolved_config).
_BENCH_WORKLOAD = ("num_warmups", "input_len", "output_len", "ignore_eos")


def leg_unknowns(leg: str | Path) -> list[str]:
    """The fields an ingested leg leaves unknown (its source did not record them), as `--json`
    lists them; the judge, not this list, decides which of them matter to a question."""
    leg = Path(leg)
    meta = json.loads((leg / LEG_FILE).read_text())
    unknown = [k for k in ("producer", "producer_version") if meta.get(k) is None]
    if meta["item"] == "forward":
        rows = load_jsonl(leg / METRICS_FILE)
        unknown += [k for k in ("step_basis", "checkpoint_version") if not any(r.get(k) is not None for r in rows)]
    elif meta["item"] == "throughput":
        config = meta.get("resolved_config") or {}
        unknown += [k for k in ("round", "slot", "concurrency", "profiled") if meta.get(k) is None]
        unknown += [f"resolved_config.{k}" for k in (*_BENCH_WORKLOAD, "node") if k not in config]
    elif meta["item"] == "quality":
        if not (leg / CONTRACT_FILE).exists():
            unknown.append("contract")
        else:
            contract = json.loads((leg / CONTRACT_FILE).read_text())
            unknown += [f"contract.{k}" for k in RecordedEvalContract.model_fields if contract.get(k) is None]
    return unknown


INGESTERS: dict[str, Callable[..., Path]] = {"bench": ingest_bench, "verl-metrics": ingest_verl_metrics,
                                             "verl-mlflow": ingest_verl_mlflow, "verl-wandb": ingest_verl_wandb,
                                             "problems": ingest_problems, "lm-eval": ingest_lm_eval}
