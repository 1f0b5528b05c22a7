"""`tica leg ingest`: results already on disk, wrapped as sealed legs (docs/receipts.md, "Ingest").

Three sources, each as its producer writes it:

- bench: a `vllm bench serve --save-result` JSON -> a throughput leg; bench.json is the file's
  bytes unchanged.
- verl-metrics: verl's file logger (one JSON object per line: `step` and metric keys such as
  `training/rollout_probs_diff_max`, `actor/grad_norm`) -> a forward leg's metrics.jsonl.
- problems: per-problem JSONL (problem_id, correct, ...) -> a quality leg's results.jsonl, with
  contract.json only when one is given.

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

from tica import strict_io
from tica.errors import InputError
from tica.metrics import VERL_FORWARD_KEYS
from tica.receipts import (BENCH_FILE, CONTRACT_FILE, LEG_FILE, METRICS_FILE, RESULTS_FILE, ForwardStep, LegMeta,
                           _validate, load_bench, load_eval_contract, load_jsonl, load_quality_results, load_step_metrics)
from tica.seal import seal_leg, sha256_file

SOURCE_FILE = "source.json"
BENCH_PRODUCER = "vllm bench serve"
VERL_PRODUCER = "verl"
# Where a vLLM result JSON may state the version that wrote it (none of the committed ones does).
_VERSION_KEYS = ("vllm_version", "version")
# Workload fields a bench JSON may carry as --metadata strings; read as the judge compares them.
_INT_FIELDS = ("input_len", "output_len")

ARMS = ("bi1", "bi0")


def _raw(path: Path) -> bytes:
    try:
        return strict_io.regular_file_bytes(path)
    except FileNotFoundError:
        raise InputError(path, "<file>", "no such file") from None
    except OSError as err:
        raise InputError(path, "<file>", f"cannot read: {err.strerror}") from None
    except strict_io.StrictInputError as err:
        raise InputError(path, "<file>", str(err)) from None


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


def _write_leg(out: Path, source: Path, kind: str, files: dict[str, bytes], **note_extra: Any) -> Path:
    """Write files (leg.json among them) and source.json into a new leg at `out`, seal it, and
    rename it into place; nothing is left behind on error."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(out, "--out", "exists and is not an empty directory: a leg is written once")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.ingest-", dir=out.parent))
    try:
        note = {"kind": kind, "path": str(source.resolve()), "sha256": "sha256:" + sha256_file(source), **note_extra}
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
    meta = _meta(path, "throughput", arm, BENCH_PRODUCER, version, round=round_, slot=slot_, concurrency=conc,
                 versions={"vllm": version} if version else None, resolved_config=config,
                 profiled=bool(bench.profiled))
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


def ingest_verl_metrics(path: str | Path, out: str | Path, arm: str, producer_version: str | None = None) -> Path:
    """verl's per-step metrics (its JSONL file logger) as a sealed forward leg. step_basis and
    checkpoint_version are unknown (verl writes neither) unless a row states them."""
    path = Path(path)
    _raw(path)
    rows, skipped = [], []
    for n, row in enumerate(load_jsonl(path), 1):
        if "step" not in row:
            raise InputError(path, f"line {n}.step", "missing: verl's file logger writes the step on every line")
        if isinstance(row.get("data"), dict) and set(row) == {"step", "data"}:
            row = {"step": row["step"], **row["data"]}  # verl's FileLogger: {"step": S, "data": {metric: value}}
        if not any(k in row for k in VERL_FORWARD_KEYS):
            skipped.append(n)  # e.g. validation before training (step 0): no forward measurement
            continue
        _validate(ForwardStep, row, path, f"line {n}")  # a bad row is named by its line in FILE
        rows.append(row)
    if not rows:
        raise InputError(path, "<file>", f"no line holds a forward metric ({', '.join(VERL_FORWARD_KEYS)})")
    data = _steps_file(path, rows, ForwardStep)
    meta = _meta(path, "forward", arm, VERL_PRODUCER, producer_version)
    return _write_leg(Path(out), path, "verl file logger (JSONL)", {LEG_FILE: _json_bytes(meta), METRICS_FILE: data},
                      lines_without_forward_metrics=skipped)


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
        load_eval_contract(contract)
        files[CONTRACT_FILE] = _raw(contract)
    meta = _meta(path, "quality", arm, producer, producer_version)
    return _write_leg(Path(out), path, "per-problem JSONL", {LEG_FILE: _json_bytes(meta), **files})


INGESTERS: dict[str, Callable[..., Path]] = {"bench": ingest_bench, "verl-metrics": ingest_verl_metrics,
                                             "problems": ingest_problems}