"""verl's per-step metrics as experiment trackers store them, read back into verl's rows
(`{"step": S, metric key: value, ...}`) for `tica leg ingest` (tica/ingest.py).

MLflow, local file store (what `mlflow.log_metrics(metrics, step=S)` writes with a `file:` tracking
URI; verl's MLflow logger calls exactly that once per step, its keys with `@` written `_at_`):

    mlruns/<experiment_id>/meta.yaml                      experiment_id, name
    mlruns/<experiment_id>/<run_id>/meta.yaml             run_id, run_name, experiment_id, lifecycle_stage
    mlruns/<experiment_id>/<run_id>/metrics/<key>         one line per value: `<timestamp ms> <value> <step>`
                                                          (MLflow >= 2.x may add `<dataset name> <digest>`)
    mlruns/<experiment_id>/<run_id>/params/<key>          the value, as text (verl: its config, keys joined by /)
    mlruns/<experiment_id>/<run_id>/tags/<key>            the value, as text

A key holding `/` is a folder path (`metrics/training/rollout_probs_diff_max`). A metric line
without its step (2 fields: `log_metric` without `step=`) is refused: the step it measured is not
recorded. verl's default tracking URI is a SQLite database (not read here): set
MLFLOW_TRACKING_URI=file:///PATH/mlruns (and, from MLflow 3.x on, MLFLOW_ALLOW_FILE_STORE=true).

W&B run history, exported (current wandb keeps an offline run's history only in its binary
`run-<id>.wandb` log; `wandb-history.jsonl` is what wandb before 0.10 wrote, rows of the same shape):

    .jsonl  one row per line: `for row in run.scan_history(): f.write(json.dumps(row) + "\\n")`
    .json   one JSON array of those rows: `json.dump(list(run.scan_history()), f)`
    .csv    `run.history(samples=N).to_csv(f)` (pandas; a leading unnamed index column is dropped)

A row is one `_step` (verl passes its global step: `wandb.log(data, step=S)`); keys starting with
`_` are W&B's own (`_runtime`, `_timestamp`) and dropped; a null or empty cell is a metric not
logged at that step (absent, never 0). CSV cells are read as numbers where they are numbers.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tica import strict_io
from tica.errors import InputError, input_text, read_yaml_mapping
from tica.progress import Progress

META = "meta.yaml"
METRICS, PARAMS, TAGS = "metrics", "params", "tags"
# Tags a run may carry naming the verl version it ran (verl itself sets none: then unknown).
VERSION_TAGS = ("verl_version", "verl.version")


def _text(path: Path) -> str:
    return input_text(path)


# ---------------------------------------------------------------- MLflow file store


@dataclass
class MlflowRun:
    """One run of an MLflow file store, read: rows by step, the files read, what it records."""

    run_dir: Path
    meta: dict[str, Any]
    rows: dict[int, dict[str, Any]]
    files: list[Path]
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)


def _is_run(folder: Path) -> bool:
    return (folder / META).is_file() and (folder / METRICS).is_dir()


def _run_meta(folder: Path) -> dict[str, Any]:
    _, meta = read_yaml_mapping(folder / META, InputError)
    if not isinstance(meta.get("run_id"), str) or not meta["run_id"]:
        raise InputError(folder / META, "run_id", "missing: not an MLflow run's meta.yaml")
    return meta


def find_mlflow_run(path: Path, run_id: str | None) -> Path:
    """The run folder: `path` itself, or the one live run under it (an experiment folder or the
    store root), or the one named `run_id`; refused when not exactly one fits."""
    if not path.is_dir():
        raise InputError(path, "<dir>", "no such directory: give an MLflow run, experiment or mlruns folder")
    if _is_run(path):
        meta = _run_meta(path)
        if run_id is not None and meta["run_id"] != run_id:
            raise InputError(path / META, "run_id", f"{meta['run_id']!r} but --run-id says {run_id!r}")
        return path
    runs = []
    for meta_file in sorted(path.glob("*/meta.yaml")) + sorted(path.glob("*/*/meta.yaml")):
        folder = meta_file.parent
        if ".trash" in folder.relative_to(path).parts or not _is_run(folder):
            continue
        meta = _run_meta(folder)
        if run_id is not None and meta["run_id"] != run_id:
            continue
        if run_id is None and meta.get("lifecycle_stage") == "deleted":
            continue  # `mlflow.delete_run` leaves the folder, marked deleted
        runs.append((meta["run_id"], folder))
    if len(runs) != 1:
        what = f" with run_id {run_id!r}" if run_id else ""
        listed = ", ".join(f"{rid} ({f.relative_to(path)})" for rid, f in runs[:10]) or "none"
        raise InputError(path, "run_id", f"{len(runs)} MLflow runs{what} under it ({listed}): "
                                          f"{'name one with --run-id' if runs else 'give a run folder'}")
    return runs[0][1]


def _key_files(root: Path) -> dict[str, Path]:
    """`<root>/<key>` files by key (a key's `/` is a folder)."""
    if not root.is_dir():
        return {}
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file()}


def _metric_values(path: Path, key: str) -> list[tuple[int, int, float]]:
    """(line, step, value) of one metric file, as MLflow's FileStore writes it."""
    out = []
    try:
        lines = strict_io.lines_of(_text(path))
    except strict_io.StrictInputError as err:
        raise InputError(path, "<file>", str(err)) from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.strip().split(" ")
        if len(parts) == 2:
            raise InputError(path, "step", f"{key}: no step on this line (logged without step=): "
                                            "which step it measured is not recorded", line=n)
        if len(parts) not in (3, 5):
            raise InputError(path, "<line>", f"{key}: {len(parts)} fields; MLflow writes "
                                              "'timestamp value step' (+ dataset name and digest)", line=n)
        try:
            int(parts[0])
        except ValueError:
            raise InputError(path, "timestamp", f"{parts[0]!r} is not a whole number of ms", line=n) from None
        try:
            value = float(parts[1])
        except ValueError:
            raise InputError(path, "value", f"{parts[1]!r} is not a number", line=n) from None
        try:
            step = int(parts[2])
        except ValueError:
            raise InputError(path, "step", f"{parts[2]!r} is not a whole number", line=n) from None
        out.append((n, step, value))
    return out


def read_mlflow_run(path: str | Path, run_id: str | None = None) -> MlflowRun:
    """Every metric of one MLflow file-store run, merged into one row per step."""
    run_dir = find_mlflow_run(Path(path), run_id)
    meta = _run_meta(run_dir)
    metric_files = _key_files(run_dir / METRICS)
    if not metric_files:
        raise InputError(run_dir / METRICS, "<dir>", "no metric files: the run logged no metrics")
    rows: dict[int, dict[str, Any]] = {}
    first: dict[tuple[int, str], int] = {}
    with Progress(f"read MLflow run {meta['run_id']}", len(metric_files)) as bar:
        for key, file in metric_files.items():
            for n, step, value in _metric_values(file, key):
                if (step, key) in first:
                    raise InputError(file, "step", f"step {step} again (first on line {first[step, key]}): "
                                                    "which value is the step's is not recorded", line=n)
                first[step, key] = n
                rows.setdefault(step, {"step": step})[key] = value
            bar.update()
    params = {k: _text(p) for k, p in _key_files(run_dir / PARAMS).items()}
    tags = {k: _text(p) for k, p in _key_files(run_dir / TAGS).items()}
    files = [run_dir / META, *metric_files.values(), *_key_files(run_dir / PARAMS).values(),
             *_key_files(run_dir / TAGS).values()]
    return MlflowRun(run_dir, meta, dict(sorted(rows.items())), files, params, tags)


def mlflow_version_tag(run: MlflowRun) -> tuple[str, str] | None:
    """(tag file, verl version) where the run carries one of VERSION_TAGS."""
    for tag in VERSION_TAGS:
        if run.tags.get(tag, "").strip():
            return f"tags/{tag}", run.tags[tag].strip()
    return None


# ---------------------------------------------------------------- W&B history export


def _cell(value: str) -> Any:
    """A CSV cell as the number it spells (pandas writes ints and floats, `nan` for NaN), else text."""
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return value


def _history_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line or row number, row) as the export holds them."""
    suffix = path.suffix.lower()
    text = _text(path)
    try:
        strict_io.lines_of(text)  # every format: a history of more rows than any run logs is refused at once
    except strict_io.StrictInputError as err:
        raise InputError(path, "<file>", str(err)) from None
    if suffix == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        if not reader.fieldnames or "_step" not in reader.fieldnames:
            raise InputError(path, "_step", "no _step column: not a W&B history export")
        # pandas' to_csv writes its index as a first, unnamed column
        try:
            return [(reader.line_num, {k: _cell(v) for k, v in row.items() if k and v not in ("", None)})
                    for row in reader]
        except csv.Error as err:  # a field past the csv module's limit (128 KiB), a NUL byte
            raise InputError(path, "<csv>", f"unreadable CSV: {err}", line=reader.line_num) from None
    if suffix == ".json":
        try:
            data = strict_io.loads(text)
        except strict_io.StrictInputError as err:
            raise InputError(path, "<json>", f"not JSON: {err}") from None
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise InputError(path, "<root>", "must be a JSON array of W&B history rows (objects)")
        return list(enumerate(data, 1))
    if suffix == ".jsonl":
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = strict_io.loads(line)
            except strict_io.StrictInputError as err:
                raise InputError(path, f"line {n}", f"not JSON: {err}") from None
            if not isinstance(row, dict):
                raise InputError(path, f"line {n}", "not a JSON object (a W&B history row)")
            rows.append((n, row))
        return rows
    raise InputError(path, "<file>", f"{suffix or 'no suffix'}: a W&B history export is .jsonl, .json or .csv")


def _whole(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)  # pandas writes a step column holding a NaN as floats: 3.0
    return None


def read_wandb_history(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """(line, verl row) per W&B history row: `_step` as `step`, W&B's own `_` keys and nulls dropped."""
    path = Path(path)
    where = "row" if path.suffix.lower() == ".json" else "line"
    out: list[tuple[int, dict[str, Any]]] = []
    seen: dict[int, int] = {}
    for n, raw in _history_rows(path):
        if "_step" not in raw or raw["_step"] is None:
            raise InputError(path, f"{where} {n}._step", "missing: a W&B history row holds its step")
        step = _whole(raw["_step"])
        if step is None:
            raise InputError(path, f"{where} {n}._step", f"{raw['_step']!r} is not a whole number")
        if step in seen:
            raise InputError(path, f"{where} {n}._step", f"step {step} again (first on {where} {seen[step]})")
        seen[step] = n
        row = {k: v for k, v in raw.items() if not k.startswith("_") and v is not None}
        if "step" in row and _whole(row["step"]) != step:
            raise InputError(path, f"{where} {n}.step", f"{row['step']!r} but _step is {step}")
        out.append((n, {**row, "step": step}))
    if not out:
        raise InputError(path, "<file>", "no rows: an empty history is no measurement")
    return out
