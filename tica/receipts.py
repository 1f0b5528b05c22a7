"""Receipts: pydantic models and loaders for what a leg leaves behind (docs/receipts.md).

Every loader raises `ReceiptError` naming the file and the field. A leg directory is read only
after its seal verifies; a bare `vllm bench serve --save-result` JSON (no leg directory) is
accepted for throughput so teams can feed their own runs, and is identified by its sha256.
"""

from __future__ import annotations

import io
import json
import math
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tica import digests, strict_io, unknowns
from tica.errors import ReceiptError, pydantic_errors
from tica.metrics import K3_KL, PEARSON, PROBS_DIFF_MAX, PROBS_DIFF_MEAN, PROBS_DIFF_STD
from tica.seal import SEAL_FILE, check_seal, seal_digest, sha256_file

LEG_FILE = "leg.json"
METRICS_FILE = "metrics.jsonl"
ARRAYS_DIR = "arrays"
RESULTS_FILE = "results.jsonl"
CONTRACT_FILE = "contract.json"
BENCH_FILE = "bench.json"
GRADCHECK_FILE = "gradcheck.json"
# The gradient check's pass line: max relative error of the analytic backward against float64
# autograd (the backward's and the update's criteria default to it; tica.question reads it here). A
# question that leaves it at this value hashes as before the field existed.
GRADCHECK_REL_TOL = 0.02

Arm = Literal["bi1", "bi0"]
# "gone": the process ended and its exit code could not be seen (not a clean exit: unknown).
EndState = Literal["exited", "killed", "force_killed", "signalled", "running", "gone"]


class _Receipt(BaseModel):
    # strict: a value of another JSON type is malformed, never converted (false read as 0, "0" as 0,
    # true as 1.0). JSON arrays still fill tuple fields (strict=False on those alone; their items
    # stay strict).
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)


# ---------------------------------------------------------------- leg.json


class ProcessIdentity(_Receipt):
    """What a process is, by content: read by the producer from the process itself (psutil) while it
    lived, never from the producer's own arguments. A field that could not be read is absent (unknown).
    Two exit entries of one identity are one process, whatever their roles and pids."""

    create_time: float | None = Field(None, gt=0, allow_inf_nan=False,
                                      description="psutil.Process(pid).create_time(): seconds since the epoch")
    name: str | None = Field(None, min_length=1, description="psutil.Process(pid).name()")
    cmdline: tuple[str | None, ...] | None = Field(None, strict=False, min_length=1,
                                            description="psutil.Process(pid).cmdline()")


class ProcessExit(_Receipt):
    # trainer_engine_core / trainer_worker: a vLLM engine the trainer itself runs (trainer=vllm_engine)
    role: Literal["client", "api_server", "engine_core", "worker", "trainer", "trainer_engine_core", "trainer_worker"]
    pid: int | None = Field(None, ge=1)
    exit_code: int | None = None
    end_state: EndState
    signal: str | int | None = None
    evidence: str | None = None
    name: str | None = Field(None, description="process name as the OS reported it (e.g. EngineCore)")
    command: tuple[str, ...] | None = Field(None, strict=False)
    identity: ProcessIdentity | None = None  # absent: the producer read none (receipts made before it did)


class LiveProcess(_Receipt):
    """A process the producer read alive when a leg's work had ended (`read_at`, ISO time), by content.
    With a create time before the leg began it shows that process ran through the leg: how one
    process's single exit stands for every leg it served (a server across rounds, a trainer across
    its forward and update legs), which a copied exit cannot show."""

    role: Literal["client", "api_server", "engine_core", "worker", "trainer", "trainer_engine_core", "trainer_worker"]
    pid: int = Field(ge=1)
    identity: ProcessIdentity
    read_at: str = Field(min_length=1, description="when the process was read alive (ISO 8601, with its zone)")


# Domains of the settings every engine and trainer records alike: (type, low, high, low excluded).
# A value outside is no such setting, whatever leg or arm records it; keys not named are read by
# the binding and alike rules as recorded (tica.receipt_fields).
_INF = math.inf
_COUNT, _INDEX = (int, 1, _INF, False), (int, 0, _INF, False)
_CONFIG_DOMAINS: dict[str, tuple[type | tuple[type, ...], float, float, bool]] = {
    "gpu_memory_utilization": ((int, float), 0, 1, True),
    **{k: _COUNT for k in ("max_model_len", "max_num_batched_tokens", "max_num_seqs", "num_prompts",
                           "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                           "hidden_size", "num_hidden_layers", "vocab_size", "input_len", "output_len",
                           "block_size", "max_concurrency")},
    **{k: _INDEX for k in ("num_warmups", "seed", "schedule_seed")},
    "random_range_ratio": ((int, float), 0, 1, False),
    "lr": ((int, float), 0, _INF, True),
    "gradcheck_tol": ((int, float), 0, _INF, True),
}
_DEVICE_DOMAINS: dict[str, tuple[type | tuple[type, ...], float, float, bool]] = {
    k: _COUNT for k in ("count", "multiprocessors", "total_memory_bytes")}


class LegTelemetry(_Receipt):
    """What a leg ran under, sampled read-only while it ran (tica.legs.telemetry); None: unknown."""
    source: Literal["nvidia-smi"] | None = None
    samples: int = Field(0, ge=0)
    interval_ms: int | None = Field(None, ge=1)
    sm_clock_mhz_median: float | None = Field(None, ge=0, allow_inf_nan=False)
    sm_clock_mhz_min: float | None = Field(None, ge=0, allow_inf_nan=False)
    mem_clock_mhz_median: float | None = Field(None, ge=0, allow_inf_nan=False)
    power_w_median: float | None = Field(None, ge=0, allow_inf_nan=False)
    temperature_c_max: float | None = Field(None, ge=-50, le=200, allow_inf_nan=False)
    gpu_util_pct_median: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    throttle_reasons: tuple[str, ...] | None = Field(None, strict=False)
    cpu_load_1m_start: float | None = Field(None, ge=0, allow_inf_nan=False)
    cpu_load_1m_end: float | None = Field(None, ge=0, allow_inf_nan=False)
    served_before: int | None = Field(None, ge=0)
    # the leg's share of the server's counters (tica.legs.telemetry.engine_counts); None: unread
    prefix_cache_hit_rate: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    preemptions: int | None = Field(None, ge=0)
    engine_steps: int | None = Field(None, ge=0)
    tokens_per_step: float | None = Field(None, ge=0, allow_inf_nan=False)
    prefix_cache_reset: bool | None = None  # emptied before the leg (True), asked and refused (False), not asked (None)
    cuda_graphs: bool | None = None
    # role (client, api_server, engine_core) -> CPU seconds over wall seconds while the leg ran
    cpu_util: dict[Literal["client", "api_server", "engine_core"],
                   Annotated[float, Field(ge=0, le=1024, allow_inf_nan=False)] | None] | None = None
    # role -> times per second it was switched out while runnable (tica.legs.telemetry); None: unread
    involuntary_switches_per_s: dict[Literal["client", "api_server", "engine_core"],
                                     Annotated[float, Field(ge=0, le=1e7, allow_inf_nan=False)] | None] | None = None
    # the machine's CPU time while the leg ran, in percent of all its CPUs: stolen by the hypervisor, busy
    cpu_steal_pct: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    cpu_busy_pct: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    cpu_mhz_median: float | None = Field(None, gt=0, le=100_000, allow_inf_nan=False)
    # one fixed pure-Python loop timed by a separate process every half second (tica.legs.telemetry.PROBE)
    cpu_probe_ms_median: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False)
    cpu_probe_ms_max: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False)
    cpu_probes: int | None = Field(None, ge=0)
    # the engine core's mean time between a request's tokens over the leg (vLLM's inter-token histogram)
    engine_itl_ms_mean: float | None = Field(None, ge=0, le=1e7, allow_inf_nan=False)
    # where the engine core ran, read with each probe (tica.legs.telemetry.placement)
    engine_cpus: tuple[Annotated[int, Field(ge=0, le=1_000_000)], ...] | None = Field(None, strict=False)
    engine_numa_nodes: tuple[Annotated[int, Field(ge=0, le=1_000_000)], ...] | None = Field(None, strict=False)
    engine_cpu_moves_pct: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    engine_sibling_busy_pct: float | None = Field(None, ge=0, le=100, allow_inf_nan=False)
    # a short loop pinned to each CPU at the leg's start and end (tica.legs.telemetry.pinned_summary)
    engine_cpu_loop_ms: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False)
    cpu_loop_ms_min: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False)
    cpu_loop_ms_max: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False)


class LegMeta(_Receipt):
    schema_: Literal["tica.leg/1"] = Field(alias="schema")
    item: Literal["forward", "backward", "update", "quality", "throughput", "clean_exit"]
    arm: Arm
    round: int | None = Field(None, ge=1, le=1_000_000)
    slot: Literal[1, 2] | None = None
    concurrency: int | None = Field(None, ge=1, le=1_000_000)
    # None: unknown (a leg ingested from a producer that names neither). Provenance, read by no
    # rule (tica.receipt_fields): what binds a leg is the candidate identity it records.
    producer: str | None = Field(None, min_length=1)
    producer_version: str | None = Field(None, min_length=1)
    trainer: Literal["vllm_kernels", "vllm_engine", "transformers", "megatron", "external"] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    # None: the package is not installed where the leg ran (e.g. dagster-pipes on a GPU box without Pipes)
    versions: dict[str, str | None] = Field(default_factory=dict)
    device: dict[str, Any] = Field(default_factory=dict)
    kernels: dict[str, Any] = Field(default_factory=dict)
    resolved_config: dict[str, Any] = Field(default_factory=dict)
    # None: not recorded (an ingested result that does not say); a profiled run is never a formal
    # measurement, and one not known to be unprofiled is not shown to be one
    profiled: bool | None = None
    # The candidate identity a leg records beside the resolved config (tica.binding compares it
    # with the manifest). None / absent: not recorded, which binds nothing.
    source: dict[str, Any] = Field(default_factory=dict, description="repository, commit (git HEAD, +dirty), overlay_digest")
    image_digest: str | None = Field(None, description="content digest of the image the leg ran in")
    # When the leg's work started and ended (not when leg.json was written).
    started_at: str | None = None
    ended_at: str | None = None
    processes: tuple[ProcessExit, ...] = Field((), strict=False)
    not_run_reason: str | None = None
    errors: tuple[str, ...] = Field((), strict=False, description="what the producer caught while running: the leg is incomplete")
    telemetry: LegTelemetry | None = Field(None, description="what the leg ran under (clocks, power, load), read only")
    alive_at_end: tuple[LiveProcess, ...] = Field((), strict=False,
                                                  description="processes read alive once the leg's work had ended")

    @model_validator(mode="after")
    def _settings_in_their_domain(self) -> "LegMeta":
        for section, domains in (("resolved_config", _CONFIG_DOMAINS), ("device", _DEVICE_DOMAINS)):
            recorded = getattr(self, section)
            for key, (kind, low, high, low_open) in domains.items():
                value = recorded.get(key)
                if value is None:
                    continue
                if isinstance(value, bool) or not isinstance(value, kind):
                    raise ValueError(f"{section}.{key} {value!r} is not a {'whole number' if kind is int else 'number'}")
                if not (low < value if low_open else low <= value) or value > high or not math.isfinite(value):
                    raise ValueError(f"{section}.{key} {value!r} is outside its domain "
                                     f"{'(' if low_open else '['}{low}, {high}]")
        return self

    @model_validator(mode="after")
    def _switch_matches_arm(self) -> "LegMeta":
        # The arm is selected by one switch; a leg whose environment says otherwise is mislabelled.
        bi = self.env.get("VLLM_BATCH_INVARIANT")
        if bi is not None and bi != ("1" if self.arm == "bi1" else "0"):
            raise ValueError(f"arm is {self.arm} but env.VLLM_BATCH_INVARIANT is {bi!r}")
        return self


def is_unknown(value: Any) -> bool:
    """What a producer did not record: absent (None), empty, or a placeholder (tica.unknowns)."""
    return unknowns.is_unknown(value)


def recorded_value(meta: LegMeta, dotted: str) -> Any | None:
    """The value of a dotted leg.json key (e.g. `versions.vllm`), None when it is unknown."""
    node: Any = meta.model_dump(mode="json", by_alias=True)
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return None if is_unknown(node) else node


# ---------------------------------------------------------------- per-step metrics


# Domains of the logged forward numbers: |p_a - p_b| of probabilities lies in [0, 1]; a std, a KL
# estimate and an absolute difference are never negative; a correlation lies in [-1, 1]. A value
# outside is no such quantity and is refused; NaN is kept (the judge reads a NaN BI=0 mean as a fault).
_FORWARD_DOMAINS: dict[str, tuple[float, float]] = {
    "probs_diff_max": (0.0, 1.0), "probs_diff_mean": (0.0, 1.0), "probs_diff_std": (0.0, 1.0),
    "pearson": (-1.0, 1.0), "k3_kl": (0.0, math.inf), "logprob_abs_diff_max": (0.0, math.inf),
    "grad_norm": (0.0, math.inf),
}


class ForwardStep(_Receipt):
    """One line of a forward metrics.jsonl, in verl's names. Extra verl keys are kept."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    step: int
    # None: unknown (verl's file logger writes neither); the forward judge names it, and a BI=1
    # claim whose steps cannot be tied to a checkpoint is inconclusive.
    step_basis: Literal["rollout", "optimizer"] | None = None
    checkpoint_version: str | None = Field(None, min_length=1)
    probs_diff_max: float | None = Field(None, alias=PROBS_DIFF_MAX)
    probs_diff_mean: float | None = Field(None, alias=PROBS_DIFF_MEAN)
    probs_diff_std: float | None = Field(None, alias=PROBS_DIFF_STD)
    pearson: float | None = Field(None, alias=PEARSON)
    k3_kl: float | None = Field(None, alias=K3_KL)
    n_tokens: int | None = Field(None, alias="tica/n_tokens", ge=0)
    n_bitwise_diff: int | None = Field(None, alias="tica/n_bitwise_diff", ge=0)
    logprob_abs_diff_max: float | None = Field(None, alias="tica/logprob_abs_diff_max")
    # sha256 of the step's scored tokens and both sides' logprobs (tica.metrics.step_content_digest):
    # what tells a logged-only step from a copy of another under a new label.
    content_sha256: str | None = Field(None, alias="tica/content_sha256")
    # verl logs the actor's grad norm per step; the BI=0 smoke check reads it (None: not recorded).
    grad_norm: float | None = Field(None, alias="actor/grad_norm")
    within_group_rewards: list[list[float]] | None = None

    @field_validator("step")
    @classmethod
    def _no_invented_step_zero(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"step {v}: verl's training steps start at 1; a step 0 row is padding, not a measurement")
        return v

    @field_validator("content_sha256")
    @classmethod
    def _a_sha256(cls, v: str | None) -> str | None:
        if v is None:
            return v
        d = digests.canonical(v)
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", d):
            raise ValueError(f"{v!r} is not a sha256 digest (sha256:<64 hex digits>)")
        return d

    @model_validator(mode="after")
    def _in_domain(self) -> "ForwardStep":
        for name, (lo, hi) in _FORWARD_DOMAINS.items():
            v = getattr(self, name)
            if v is not None and math.isfinite(v) and not lo <= v <= hi:
                raise ValueError(f"{name} {v!r} is outside [{lo:g}, {hi:g}]: no such quantity can take it")
        mx, mean = self.probs_diff_max, self.probs_diff_mean
        if mx is not None and mean is not None and math.isfinite(mx) and math.isfinite(mean) and mean > mx:
            raise ValueError(f"probs diff mean {mean!r} above its max {mx!r}: no such pair of statistics")
        return self


class BackwardStep(_Receipt):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)

    step: int
    step_basis: Literal["rollout", "optimizer"] | None = None
    checkpoint_version: str | None = None
    grad_norm: float | None = Field(None, alias="actor/grad_norm")
    grad_finite: bool | None = None
    params_total: int = Field(..., ge=1)
    params_with_grad: int = Field(..., ge=0)
    params_nonzero_grad: int | None = Field(None, ge=0)
    within_group_rewards: list[list[float]] | None = None
    deployed_bytes_equal: bool | None = None
    # The producer's gradient check (analytic backward vs float64 autograd) and, per op, whether
    # its planted backward error was detected. None: no gradient check was recorded.
    gradcheck_pass: bool | None = Field(None, alias="tica/gradcheck_pass")
    gradcheck_controls_caught: dict[str, bool] | None = Field(None, alias="tica/gradcheck_controls_caught")

    @field_validator("step")
    @classmethod
    def _no_invented_step_zero(cls, v: int) -> int:
        return ForwardStep._no_invented_step_zero(v)

    @model_validator(mode="after")
    def _counts(self) -> "BackwardStep":
        if self.grad_norm is not None and math.isfinite(self.grad_norm) and self.grad_norm < 0:
            raise ValueError(f"grad norm {self.grad_norm!r}: a norm is never negative")
        if self.params_with_grad > self.params_total:
            raise ValueError(f"params_with_grad {self.params_with_grad} > params_total {self.params_total}")
        if self.params_nonzero_grad is not None and self.params_nonzero_grad > self.params_with_grad:
            raise ValueError(f"params_nonzero_grad {self.params_nonzero_grad} > params_with_grad {self.params_with_grad}")
        return self


class UpdateRerun(_Receipt):
    """The same update run again from the same weights, batch, loss and optimizer. What the rule
    reads is the content (the grad norm, the updated weights' hash); the producer's own comparisons
    are informational."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    grad_norm: float
    updated_weights_hash: str = Field(..., min_length=1)
    how: str = Field(..., min_length=1, description="informational: what was run again, and where")
    grad_norm_equal: bool | None = Field(None, description="informational")
    weights_equal: bool | None = Field(None, description="informational")
    tensors_differ: list[str] | None = Field(None, description="informational")
    n_tensors_differ: int | None = Field(None, ge=0, description="informational")


class UpdateStep(BackwardStep):
    optimizer: str
    weights_changed_tensors: int = Field(..., ge=0)
    weights_total_tensors: int = Field(..., ge=1)
    updated_weights_hash: str | None = None
    reloaded_by_rollout: bool | None = None
    rerun: UpdateRerun | None = Field(None, alias="tica/update_rerun")

    @model_validator(mode="after")
    def _tensors(self) -> "UpdateStep":
        if self.weights_changed_tensors > self.weights_total_tensors:
            raise ValueError(f"weights_changed_tensors {self.weights_changed_tensors} > weights_total_tensors "
                             f"{self.weights_total_tensors}")
        return self


class GradcheckOp(_Receipt):
    """One op of a gradient check: the relative errors of its analytic backward against float64
    autograd. The pass line is the frozen question's (BackwardCriteria.gradcheck_rel_tol): the
    receipt's own `tol`, `max_rel_err` and `pass` are informational, never read as a verdict."""

    op: str = Field(..., min_length=1)
    rel_err: tuple[float, ...] = Field(..., min_length=1, strict=False)
    finite: bool
    tol: float | None = Field(None, description="informational: the producer's tolerance")
    max_rel_err: float | None = Field(None, description="informational: recomputed from rel_err")
    forward_rel_err: float | None = Field(None, description="informational")
    pass_: bool | None = Field(None, alias="pass", description="informational: recomputed under the question")


class GradcheckRun(_Receipt):
    """One run of the check: the real backward (`planted` null) or a control with a planted error."""

    kernels: str | None = Field(None, min_length=1, description="the kernels checked: must be the leg's trainer")
    device: str | None = Field(None, description="informational")
    dtype: str | None = Field(None, description="informational")
    planted: str | None = Field(None, min_length=1, description="the op whose backward carries the planted error")
    tol: float | None = Field(None, description="informational: the producer's tolerance")
    ops: tuple[GradcheckOp, ...] = Field(..., min_length=1, strict=False)
    pass_: bool | None = Field(None, alias="pass", description="informational: recomputed under the question")


class GradcheckFile(_Receipt):
    """gradcheck.json: the check and its planted-error controls."""

    check: GradcheckRun
    controls: tuple[GradcheckRun, ...] = Field((), strict=False)
    controls_caught: dict[str, bool] | None = Field(None, description="informational: recomputed per planted op")
    pass_: bool | None = Field(None, alias="pass", description="informational: recomputed under the question")


def load_gradcheck(path: str | Path) -> GradcheckFile:
    path = Path(path)
    return validate_receipt(GradcheckFile, load_json(path), path)


def as_read(value: Any) -> Any:
    """A parsed receipt as every rule reads it: placeholders absent (tica.unknowns), and a whole
    number written as a float (`1.0`) read as the number it is (JSON has one number type: `1` and
    `1.0` are one value spelled two ways, and a count's spelling never decides a verdict)."""
    value = unknowns.without_placeholders(value)
    return _whole_numbers(value)


def _whole_numbers(value: Any) -> Any:
    kind = type(value)
    if kind is float or isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < 2 ** 53 else value
    if kind is dict or isinstance(value, dict):
        return {k: v if type(v) in _NO_FLOATS else _whole_numbers(v) for k, v in value.items()}
    if kind is list or isinstance(value, list):
        return [v if type(v) in _NO_FLOATS else _whole_numbers(v) for v in value]
    return value


_NO_FLOATS = frozenset({int, str, bool, type(None)})  # nothing inside to read as a whole number


def _read_text(path: Path) -> str:
    try:
        return strict_io.text_of(strict_io.regular_file_bytes(path))
    except OSError as err:
        raise ReceiptError(path, "<file>", f"cannot read: {err.strerror}") from None
    except strict_io.StrictInputError as err:
        raise ReceiptError(path, "<file>", str(err)) from None


def load_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a receipt's JSON Lines file, placeholders made absent (tica.unknowns)."""
    path = Path(path)
    rows = []
    try:
        lines = strict_io.lines_of(_read_text(path))
    except strict_io.StrictInputError as err:
        raise ReceiptError(path, "<file>", str(err)) from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = as_read(strict_io.loads(line))
        except strict_io.StrictInputError as err:
            raise ReceiptError(path, f"line {n}", str(err)) from None
        if not isinstance(row, dict):
            raise ReceiptError(path, f"line {n}", "each line must be a JSON object")
        rows.append(row)
    return rows


def load_json(path: str | Path) -> dict[str, Any]:
    """A receipt's JSON object, placeholders made absent (tica.unknowns): every rule reads a
    receipt through here or `read_receipt`."""
    path = Path(path)
    try:
        data = as_read(strict_io.loads(_read_text(path)))
    except strict_io.StrictInputError as err:
        raise ReceiptError(path, "<json>", str(err)) from None
    if not isinstance(data, dict):
        raise ReceiptError(path, "<root>", "must be a JSON object")
    return data


def read_receipt(path: str | Path) -> Any:
    """A receipt file's JSON as the rules see it (placeholders made absent), for readers that
    look at a few keys before the models: ValueError or OSError where it cannot be read."""
    return as_read(strict_io.read_json(path))


def validate_receipt(model: type[BaseModel], data: Any, path: Path, where: str = "") -> Any:
    """`data` read through `model`; a ReceiptError naming the file and the field (under `where`,
    e.g. a line) where it does not validate. Every receipt loader reads through here, a room's too."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        e = pydantic_errors(ReceiptError, path, err)
        if where:
            raise ReceiptError(path, f"{where}.{e.field}", e.message) from None
        raise e from None


def load_step_metrics(path: str | Path, model: type[BackwardStep] | type[ForwardStep]) -> list[Any]:
    """Steps in file order; duplicates, decreasing steps and mixed step bases are refused."""
    path = Path(path)
    steps = [validate_receipt(model, row, path, f"line {n}") for n, row in enumerate(load_jsonl(path), 1)]
    seen: set[int] = set()
    for n, s in enumerate(steps, 1):
        if s.step in seen:
            raise ReceiptError(path, f"line {n}.step", f"step {s.step} appears twice")
        if seen and s.step < max(seen):
            raise ReceiptError(path, f"line {n}.step", f"step {s.step} after step {max(seen)}: steps must increase")
        seen.add(s.step)
    bases = {s.step_basis for s in steps if s.step_basis is not None}
    if len(bases) > 1:
        raise ReceiptError(path, "step_basis", f"mixes step bases {sorted(bases)}: one file, one basis")
    return steps


# ---------------------------------------------------------------- per-token arrays


@dataclass(frozen=True)
class StepArrays:
    path: Path
    token_ids: np.ndarray
    seq_lens: np.ndarray
    trainer_logprobs: np.ndarray
    rollout_logprobs: np.ndarray
    decode_logprobs: np.ndarray | None
    decode_mask: np.ndarray | None
    # a mixture of experts' routes (tica.routing): tokens x MoE layers x top-k, both sides or neither
    rollout_experts: np.ndarray | None = None
    trainer_experts: np.ndarray | None = None
    rollout_gate_weights: np.ndarray | None = None
    trainer_gate_weights: np.ndarray | None = None
    # expert parallelism: each rank's routes (its replicated router's), ranks x tokens x layers x top-k
    trainer_experts_ranks: np.ndarray | None = None


_ARRAY_DTYPES = {
    "token_ids": np.int32,
    "seq_lens": np.int32,
    "trainer_logprobs": np.float32,
    "rollout_logprobs": np.float32,
    "decode_logprobs": np.float32,
    "decode_mask": np.bool_,
    "rollout_experts": np.int32,
    "trainer_experts": np.int32,
    "rollout_gate_weights": np.float32,
    "trainer_gate_weights": np.float32,
    "trainer_experts_ranks": np.int32,
}
_ROUTING = ("rollout_experts", "trainer_experts", "rollout_gate_weights", "trainer_gate_weights",
            "trainer_experts_ranks")


def _check_routing(path: Path, data: dict[str, np.ndarray], n: int) -> None:
    """Routes come as a pair (experts on both sides; gate weights on both sides or neither, and
    only beside experts), one tokens x layers x top-k shape, expert ids >= 0, no expert twice in
    one route, finite gate weights."""
    present = [k for k in _ROUTING if k in data]
    if not present:
        return
    if "rollout_experts" not in data or "trainer_experts" not in data:
        raise ReceiptError(path, present[0], "routes come from both sides: rollout_experts and trainer_experts")
    if ("rollout_gate_weights" in data) != ("trainer_gate_weights" in data):
        raise ReceiptError(path, "trainer_gate_weights", "gate weights come from both sides or neither")
    shape = data["rollout_experts"].shape
    if len(shape) != 3 or shape[0] != n or 0 in shape:
        raise ReceiptError(path, "rollout_experts", f"shape {shape}: one route per token and MoE layer "
                           f"({n} tokens x layers x top-k)")
    for key in present:
        if key != "trainer_experts_ranks" and data[key].shape != shape:
            raise ReceiptError(path, key, f"shape {data[key].shape}, the rollout's routes are {shape}")
    if "trainer_experts_ranks" in data:
        ranks = data["trainer_experts_ranks"].shape
        if len(ranks) != 4 or ranks[0] < 2 or ranks[1:] != shape:
            raise ReceiptError(path, "trainer_experts_ranks", f"shape {ranks}: two or more ranks of {shape} routes")
    for key in ("rollout_experts", "trainer_experts", "trainer_experts_ranks"):
        if key not in data:
            continue
        ex = data[key]
        if int(ex.min()) < 0:
            raise ReceiptError(path, key, f"a negative expert id ({int(ex.min())})")
        ordered = np.sort(ex, axis=-1)
        if (ordered[..., 1:] == ordered[..., :-1]).any():
            raise ReceiptError(path, key, "an expert appears twice in one route")
    for key in ("rollout_gate_weights", "trainer_gate_weights"):
        if key in data and not np.isfinite(data[key]).all():
            raise ReceiptError(path, key, "non-finite gate weight(s)")


def load_step_arrays(path: str | Path) -> StepArrays:
    path = Path(path)
    try:
        raw = strict_io.regular_file_bytes(path)
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:  # a truncated or foreign file
        raise ReceiptError(path, "<npz>", f"cannot read arrays: {type(err).__name__}: {err}") from None
    for key in ("token_ids", "seq_lens", "trainer_logprobs", "rollout_logprobs"):
        if key not in data:
            raise ReceiptError(path, key, "missing array")
    for key, arr in data.items():
        want = _ARRAY_DTYPES.get(key)
        if want is not None and arr.dtype != want:
            raise ReceiptError(path, key, f"dtype {arr.dtype}, expected {np.dtype(want)}")
    n = data["token_ids"].size
    if n == 0:
        raise ReceiptError(path, "token_ids", "no tokens: an empty step is not a measurement")
    if data["seq_lens"].size and int(data["seq_lens"].min()) < 0:
        raise ReceiptError(path, "seq_lens", f"a negative sequence length ({int(data['seq_lens'].min())})")
    if int(data["seq_lens"].sum()) != n:
        raise ReceiptError(path, "seq_lens", f"sum {int(data['seq_lens'].sum())} != {n} tokens")
    for key in ("trainer_logprobs", "rollout_logprobs", "decode_logprobs", "decode_mask"):
        if key in data and data[key].size != n:
            raise ReceiptError(path, key, f"{data[key].size} entries for {n} tokens")
    for key in ("trainer_logprobs", "rollout_logprobs", "decode_logprobs", "decode_mask"):
        if key in data and data[key].ndim != 1:
            raise ReceiptError(path, key, f"shape {data[key].shape}: one value per token, a flat array")
    if ("decode_logprobs" in data) != ("decode_mask" in data):
        raise ReceiptError(path, "decode_mask", "decode_logprobs and decode_mask come together")
    _check_routing(path, data, n)
    # A scored token has a finite logprob: -inf on both sides is "bitwise equal" and no measurement.
    # (decode_logprobs holds a value only where decode_mask is set: the rest is filler.)
    scored = {"trainer_logprobs": data["trainer_logprobs"], "rollout_logprobs": data["rollout_logprobs"]}
    if "decode_logprobs" in data and data["decode_mask"].size == data["decode_logprobs"].size:
        scored["decode_logprobs"] = data["decode_logprobs"][data["decode_mask"]]
    for key, values in scored.items():
        if not np.isfinite(values).all():
            raise ReceiptError(path, key, f"{int((~np.isfinite(values)).sum())} non-finite logprob(s) of scored tokens")
        # a log-probability is at most 0: a positive one is no logprob, equal on both sides or not
        if values.size and float(values.max()) > 0:
            raise ReceiptError(path, key, f"{int((values > 0).sum())} positive value(s) (max {float(values.max())!r}): "
                               "a log-probability is at most 0")
    return StepArrays(
        path=path,
        token_ids=data["token_ids"],
        seq_lens=data["seq_lens"],
        trainer_logprobs=data["trainer_logprobs"],
        rollout_logprobs=data["rollout_logprobs"],
        decode_logprobs=data.get("decode_logprobs"),
        decode_mask=data.get("decode_mask"),
        **{k: data.get(k) for k in _ROUTING},
    )


def step_arrays_path(forward_dir: Path, step: int) -> Path:
    return forward_dir / ARRAYS_DIR / f"step_{step:04d}.npz"


# ---------------------------------------------------------------- quality


class ProblemResult(_Receipt):
    model_config = ConfigDict(extra="allow", frozen=True)

    problem_id: str = Field(..., min_length=1)
    correct: bool
    prompt_hash: str | None = None
    response: str | None = None
    extracted: str | None = None
    truncated: bool | None = None


class Sampling(_Receipt):
    """Sampling parameters as a contract.json records them; None: not recorded (unknown), never
    vLLM's default filled in (a run whose stop tokens nobody wrote down did not stop on none)."""

    temperature: float = Field(..., ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None
    seed: int | None = None
    n: int | None = Field(None, ge=1)
    stop: tuple[str, ...] | None = Field(None, strict=False)

    def item(self) -> dict[str, Any] | None:
        """The contract item, None when a parameter the output depends on is unknown: under greedy
        decoding (temperature 0) the temperature, n and stop tokens; when sampling, all of them."""
        d = self.model_dump(mode="json")
        needed = ("temperature", "n", "stop") if self.temperature == 0 else tuple(d)
        return None if any(d[k] is None for k in needed) else d


class RecordedEvalContract(_Receipt):
    """What a contract.json records of the six items of the evaluation contract (two scores
    differing in any are not one score), each possibly unknown (None): an ingested run states
    only what its producer wrote (tica.ingest). An unknown item is never filled with a default,
    and never compared equal."""

    dataset_version: str | None = Field(None, min_length=1)
    prompt_template: str | None = Field(None, min_length=1)
    thinking_mode: str | None = None
    sampling: Sampling | None = None
    repeats: int | None = Field(None, ge=1)
    scorer: str | None = Field(None, min_length=1)
    length_cap: int | None = Field(None, ge=1)

    def six_items(self) -> dict[str, Any]:
        """The six items, as the practice names them; None: the item is unknown (in part or whole)."""
        template = (None if self.prompt_template is None or self.thinking_mode is None
                    else (self.prompt_template, self.thinking_mode))
        return {
            "dataset version": self.dataset_version,
            "prompt/chat template and thinking mode": template,
            "sampling parameters": None if self.sampling is None else self.sampling.item(),
            "number of repeats": self.repeats,
            "scorer": self.scorer,
            "length cap": self.length_cap,
        }

    @property
    def greedy(self) -> bool | None:
        return None if self.sampling is None else self.sampling.temperature == 0


def load_quality_results(path: str | Path) -> list[ProblemResult]:
    path = Path(path)
    return [validate_receipt(ProblemResult, row, path, f"line {n}") for n, row in enumerate(load_jsonl(path), 1)]


# ---------------------------------------------------------------- throughput (vllm bench serve JSON)


class BenchResult(BaseModel):
    """What `vllm bench serve --save-result` writes. `--metadata k=v` pairs are top-level strings
    (read from text where a field says so: `--metadata num_prompts=N` overwrites vLLM's own count
    with the string "N"); the counts and rates vLLM writes as numbers are strict otherwise (true is
    no count, "12" no rate)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    num_prompts: int = Field(..., ge=0, strict=True)
    max_concurrency: int | None = Field(..., ge=1, strict=True)
    # seconds; no benchmark runs for a year (a 1e30 s duration overflowed the judge's time checks)
    duration: float = Field(..., gt=0, le=365 * 24 * 3600, strict=True)
    completed: int = Field(..., ge=0, strict=True)
    failed: int = Field(0, ge=0, strict=True)
    total_input_tokens: int = Field(..., ge=0, strict=True)
    total_output_tokens: int = Field(..., ge=0, strict=True)
    request_throughput: float = Field(..., ge=0, strict=True)
    output_throughput: float = Field(..., ge=0, strict=True)
    total_token_throughput: float | None = Field(None, ge=0, strict=True)
    mean_ttft_ms: float | None = Field(None, ge=0, strict=True)
    median_ttft_ms: float | None = Field(None, ge=0, strict=True)
    p99_ttft_ms: float | None = Field(None, ge=0, strict=True)
    mean_tpot_ms: float | None = Field(None, ge=0, strict=True)
    median_tpot_ms: float | None = Field(None, ge=0, strict=True)
    p99_tpot_ms: float | None = Field(None, ge=0, strict=True)
    mean_itl_ms: float | None = Field(None, ge=0, strict=True)
    median_itl_ms: float | None = Field(None, ge=0, strict=True)
    errors: list[str | None] | None = None
    arm: Arm | None = None
    round: int | None = Field(None, ge=1)  # rounds are numbered from 1, as leg.json's (LegMeta.round)
    slot: Literal[1, 2] | None = None
    num_warmups: int | None = None
    ignore_eos: bool | None = None
    profiled: bool | None = None

    @field_validator("round", "slot", "num_warmups", "num_prompts", mode="before")
    @classmethod
    def _metadata_int(cls, v: Any) -> Any:
        return int(v) if isinstance(v, str) and v.strip().lstrip("-").isdigit() else v

    @field_validator("ignore_eos", "profiled", mode="before")
    @classmethod
    def _metadata_bool(cls, v: Any) -> Any:
        if isinstance(v, str) and v.lower() in ("true", "1", "false", "0"):
            return v.lower() in ("true", "1")
        return v

    @property
    def error_count(self) -> int:
        listed = sum(1 for e in self.errors or () if e)
        return max(self.failed, listed)


def load_bench(path: str | Path) -> BenchResult:
    path = Path(path)
    data = load_json(path)
    bench = validate_receipt(BenchResult, data, path)
    # Every number that can enter a loss or a table must be a finite number (+inf is not > 0's friend).
    for key, value in bench.model_dump().items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ReceiptError(path, key, f"{value} is not a finite number")
    # run settings vLLM writes: a request rate is above 0 ("inf": as fast as possible), so is burstiness
    for key in ("request_rate", "burstiness"):
        value = (bench.model_extra or {}).get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not value > 0:
            raise ReceiptError(path, key, f"{value!r}: a {key.replace('_', ' ')} is above 0")
    return bench


# ---------------------------------------------------------------- legs


@dataclass(frozen=True)
class Leg:
    """A sealed leg directory, read after its seal verified."""

    path: Path
    meta: LegMeta
    digest: str

    @property
    def arm(self) -> Arm:
        return self.meta.arm


def verify_seal(leg_dir: str | Path) -> str:
    """Raise ReceiptError unless the seal verifies; return the leg's digest."""
    leg_dir = Path(leg_dir)
    problems = check_seal(leg_dir)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ReceiptError(leg_dir / SEAL_FILE, "files", problems[0] + more)
    return seal_digest(leg_dir)


def load_leg_meta(path: str | Path) -> LegMeta:
    path = Path(path)
    return validate_receipt(LegMeta, load_json(path), path)


def write_leg_meta(leg_dir: str | Path, meta: dict[str, Any]) -> LegMeta:
    """The one writer of leg.json, for every producer: the record is written only if it reads back
    through load_leg_meta (the judges' model), so a leg TICA cannot read is never sealed as a
    receipt. Values JSON cannot hold are written as their text (a path, a timestamp)."""
    path = Path(leg_dir) / LEG_FILE
    text = json.dumps(meta, indent=1, default=str)
    try:
        read = as_read(strict_io.loads(text))
    except strict_io.StrictInputError as err:
        raise ReceiptError(path, "<json>", str(err)) from None
    if not isinstance(read, dict):
        raise ReceiptError(path, "<root>", "must be a JSON object")
    model = validate_receipt(LegMeta, read, path)
    path.write_text(text)
    return model


def load_process_exits(leg_dir: str | Path) -> tuple[ProcessExit, ...]:
    """The exit receipts of a sealed leg: how every client, server, EngineCore, worker ended."""
    return load_leg(leg_dir).meta.processes


def load_leg(leg_dir: str | Path) -> Leg:
    leg_dir = Path(leg_dir)
    if not leg_dir.is_dir():
        raise ReceiptError(leg_dir, "<dir>", "not a leg directory")
    digest = verify_seal(leg_dir)
    return Leg(path=leg_dir, meta=load_leg_meta(leg_dir / LEG_FILE), digest=digest)


@dataclass(frozen=True)
class BenchLeg:
    """One throughput leg: a bench JSON, inside a sealed leg directory or bare."""

    path: Path
    bench: BenchResult
    meta: LegMeta | None
    digest: str

    @property
    def arm(self) -> Arm | None:
        return self.meta.arm if self.meta else self.bench.arm

    @property
    def round(self) -> int | None:
        return self.bench.round if self.bench.round is not None else (self.meta.round if self.meta else None)

    @property
    def slot(self) -> int | None:
        return self.bench.slot if self.bench.slot is not None else (self.meta.slot if self.meta else None)

    @property
    def concurrency(self) -> int | None:
        return self.bench.max_concurrency

    @property
    def profiled(self) -> bool | None:
        """True if either receipt says the run was profiled, False if one says it was not and none
        that it was, None where neither records it (unknown: not shown to be a formal measurement)."""
        said = [self.bench.profiled, self.meta.profiled if self.meta is not None else None]
        return True if True in said else False if False in said else None

    def workload(self, key: str) -> Any:
        """A workload setting from the leg's resolved config, else from the bench metadata. Where a
        producer read the bench command line itself (`tica leg run`), a setting its flags do not
        state is unknown: a `--metadata` label is the user's text, not an observation."""
        if self.meta is not None and key in self.meta.resolved_config:
            return self.meta.resolved_config[key]
        if self.meta is not None and self.meta.resolved_config.get("command_kind") == "vllm bench serve":
            return None
        return getattr(self.bench, key, None)


def load_bench_leg(path: str | Path) -> BenchLeg:
    path = Path(path)
    if path.is_dir():
        leg = load_leg(path)
        bench = load_bench(path / BENCH_FILE)
        for key in ("arm", "round", "slot"):
            said, meta_said = getattr(bench, key), getattr(leg.meta, key)
            if said is not None and meta_said is not None and said != meta_said:
                raise ReceiptError(path / BENCH_FILE, key, f"{said!r} but leg.json says {meta_said!r}")
        if bench.max_concurrency is not None and leg.meta.concurrency not in (None, bench.max_concurrency):
            raise ReceiptError(path / BENCH_FILE, "max_concurrency",
                               f"{bench.max_concurrency} but leg.json says {leg.meta.concurrency}")
        return BenchLeg(path=path, bench=bench, meta=leg.meta, digest=leg.digest)
    bench = load_bench(path)
    if bench.arm is None:
        raise ReceiptError(path, "arm", "missing: run vllm bench serve with --metadata arm=bi1|bi0 round=R slot=S")
    return BenchLeg(path=path, bench=bench, meta=None, digest="sha256:" + sha256_file(path))


# ---------------------------------------------------------------- recipe dry runs


class ResolvedCommand(_Receipt):
    command: str
    rc: int


class RecipeCombo(_Receipt):
    """One mode x optimizer x arm, printed by the recipe's dry-run (or compose) mode."""

    mode: Literal["dry_run", "compose"]
    optimizer: str = Field(..., min_length=1)
    arm: Arm
    before: ResolvedCommand | None = Field(None, description="the original recipe (for BI=0: the original baseline recipe)")
    after: ResolvedCommand | None = None


class RecipeDryRuns(_Receipt):
    schema_: Literal["tica.recipe_dry_runs/1"] = Field(alias="schema")
    recipe: str
    combos: tuple[RecipeCombo, ...] = Field(..., min_length=1, strict=False)

    @model_validator(mode="after")
    def _unique(self) -> "RecipeDryRuns":
        keys = [(c.mode, c.optimizer, c.arm) for c in self.combos]
        dup = {k for k in keys if keys.count(k) > 1}
        if dup:
            raise ValueError(f"combination {sorted(dup)[0]} listed twice")
        return self


def load_recipe_dry_runs(path: str | Path) -> tuple[RecipeDryRuns, str]:
    """The dry-run receipt and its identity (seal digest of its directory, or the file's sha256)."""
    path = Path(path)
    if path.is_dir():
        digest = verify_seal(path)
        path = path / "recipe_dry_runs.json"
    else:
        digest = "sha256:" + sha256_file(path) if path.is_file() else ""
    return validate_receipt(RecipeDryRuns, load_json(path), path), digest
