"""Leg runners: where a frozen question's legs run, as a Dagster resource.

`LegRunner` is the interface; an evidence asset hands it one `LegRequest` (item, frozen
question, candidate, output folder) and gets back the sealed leg directories. Judges read those
directories and nothing else, so every runner is interchangeable:

- `CpuLegRunner` (the default): each leg's producer in its own process through Dagster Pipes
  (`PipesSubprocessClient` over `tica.legs.runner.leg_command`), the arm's switches set in the
  child's environment before anything imports vLLM.
- `ReplayLegRunner`: replays committed sealed receipts (a track measured elsewhere, e.g. on an
  H200, and fast tests). Nothing is re-run; the receipts are judged where they lie.
- `LocalGpuLegRunner` (resources/gpu.py): the H200 producers on this machine's GPUs, each
  command a Pipes child on devices leased from one machine-wide GPU pool (`tica.gpu_pool`).
  A remote GPU runner subclasses `LegRunner` the same way, with another Pipes client
  (Kubernetes, Slurm).
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import yaml
from dagster import AssetExecutionContext, ConfigurableResource, PipesSubprocessClient
from pydantic import Field, field_validator

from tica.acceptance import LegBatch
from tica.errors import ReceiptError
from tica.evidence import EvidenceItem
from tica.items.registry import resolve, room
from tica.manifest import LoadedManifest
from tica.question import Question, ThroughputCriteria
from tica.receipt_archive import is_archive, unpacked
from tica.seal import SEAL_FILE

PROJECT_ROOT = Path(__file__).resolve().parents[1]
LEG_FILE = "leg.json"

# A round's pairing order names which arm runs first: A is the question's arm_a (BI=1 unless a
# throughput question freezes another), B the other; tica.pairing defines it, Question.round_arms reads it.


@dataclass(frozen=True)
class LegSpec:
    """One leg: one arm of one item, at one round / slot / concurrency where they apply."""

    item: EvidenceItem
    arm: str
    round: int | None = None
    slot: int | None = None
    concurrency: int | None = None

    @property
    def name(self) -> str:
        parts = [self.arm]
        if self.concurrency is not None:
            parts.append(f"c{self.concurrency}")
        if self.round is not None:
            parts.append(f"r{self.round}")
        if self.slot is not None:
            parts.append(f"s{self.slot}")
        return "-".join(parts)


@dataclass(frozen=True)
class LegRequest:
    track: str
    item: EvidenceItem
    question: Question
    manifest: LoadedManifest
    candidate_id: str
    out_dir: Path


def plan_legs(item: EvidenceItem, question: Question) -> list[LegSpec]:
    """The legs a frozen question calls for, in the frozen order.

    Throughput: per round, the round's pair in its pairing order; each leg runs every
    concurrency of the question (one sealed sub-leg per concurrency, each warmed up on its
    own; its room's plan, tica/items/throughput/legs.py). Other items: one leg per arm, in the
    first round's order. The final artifacts run no legs of their own (their room's plan,
    tica/items/artifacts/legs.py).
    """
    if (own := room(item).leg_plan) is not None:  # an item in a room of its own plans its legs there
        # (arm, slot), or (arm, slot, round) where the plan runs rounds (throughput's crossed pairs)
        return [LegSpec(item, arm, slot=slot, round=rnd[0] if rnd else None)
                for arm, slot, *rnd in resolve(own)(question)]
    first = question.round_arms(1)
    return [LegSpec(item, arm, slot=slot) for slot, arm in enumerate(first, start=1)]


def progress_line(k: int, n: int, spec: LegSpec, question: Question, elapsed_s: float) -> str:
    """Where a long first run stands, in one line: "throughput leg 3 of 12: bi0, c=1,2, round 2,
    1 min 05 s elapsed"."""
    parts = [spec.arm]
    if spec.concurrency is not None:
        parts.append(f"c={spec.concurrency}")
    elif isinstance(question.criteria, ThroughputCriteria):  # one leg runs every frozen concurrency
        parts.append("c=" + ",".join(str(c) for c in question.criteria.concurrencies))
    if spec.round is not None:
        parts.append(f"round {spec.round}")
    parts.append(f"{duration(elapsed_s)} elapsed")
    return f"{spec.item.value} leg {k} of {n}: {', '.join(parts)}"


def duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def sealed_leg_dirs(folder: Path) -> list[Path]:
    """Every sealed leg directory under folder (outermost only: a leg's own sub-receipts,
    such as an update's post-update forward, belong to it)."""
    if not folder.is_dir():
        return []
    legs: list[Path] = []
    for seal in sorted(folder.rglob(SEAL_FILE)):
        leg = seal.parent
        if not any(parent in legs for parent in leg.parents):
            legs.append(leg)
    return legs


class LegRunner(ConfigurableResource, ABC):
    """Runs the legs of one evidence item and returns their sealed directories."""

    @abstractmethod
    def run_legs(self, context: AssetExecutionContext, request: LegRequest) -> list[Path]: ...

    def run_batches(self, context: AssetExecutionContext, request: LegRequest) -> list[LegBatch]:
        """The legs as the batches judged into verdicts: one batch, unless a runner replays
        several committed runs (each a rerun of the one before)."""
        return [LegBatch(legs=self.run_legs(context, request))]

    @property
    def kind(self) -> str:
        return type(self).__name__


class CpuLegRunner(LegRunner):
    """Each leg a producer process (`python -m tica.legs.<item> --out --arm ...`, built by
    `tica.legs.runner.leg_command`) launched through Dagster Pipes: the producer opens Pipes
    itself, so its logs and messages land in the run, and it seals its leg last."""

    producer_module: str = Field(
        "", description="module run in place of tica.legs.<item> (a site's wrapper around the producers); empty = the producer"
    )
    child_output: str = Field(
        "log", description="'log': each leg's stdout and stderr (vLLM's and torch's own warnings, progress bars) go "
                           "to <leg>.log beside the leg, and a failed leg's last lines to the run's log; 'console': forwarded"
    )

    @field_validator("child_output")
    @classmethod
    def _known_output(cls, value: str) -> str:
        if value not in ("log", "console"):
            raise ValueError(f"CpuLegRunner.child_output is {value!r}; it is 'log' or 'console'")
        return value

    def run_legs(self, context: AssetExecutionContext, request: LegRequest) -> list[Path]:
        from tica.legs.runner import leg_command  # standard library only

        client = PipesSubprocessClient(cwd=str(PROJECT_ROOT))
        legs: list[Path] = []
        planned = plan_legs(request.item, request.question)
        started = time.monotonic()
        for k, spec in enumerate(planned, start=1):
            out = request.out_dir / spec.name
            out.parent.mkdir(parents=True, exist_ok=True)
            # The arm's switch is in the child's environment, so it holds before the child (or
            # anything it spawns) imports vLLM.
            command, env = leg_command(spec.item.value, spec.arm, out, **leg_params(spec, request))
            if self.producer_module:
                command[command.index("-m") + 1] = self.producer_module
            context.log.info(progress_line(k, len(planned), spec, request.question, time.monotonic() - started))
            context.log.debug(f"leg {request.item.value}/{spec.name}: {' '.join(command[1:7])} ...")
            log = out.parent / f"{spec.name}.log"
            if self.child_output == "log":  # Pipes messages travel through a file, not the child's stdio
                command = ["/bin/sh", "-c", 'exec "$@" > "$TICA_LEG_OUTPUT" 2>&1', "leg", *command]
                env = {**env, "TICA_LEG_OUTPUT": str(log)}
            try:
                client.run(context=context, command=command, env=env)
            except Exception as err:  # a failed leg that sealed its receipt is evidence, kept as is
                if log.is_file():
                    context.log.error(f"leg {spec.name} failed; the last lines of {log.name}:\n{_tail(log)}")
                if not sealed_leg_dirs(out):
                    raise
                context.log.warning(f"leg {spec.name} exited with an error but left a sealed receipt: {err}")
            sealed = sealed_leg_dirs(out)  # a throughput leg holds one sealed leg per concurrency
            if not sealed:
                raise RuntimeError(f"leg {spec.name} left no sealed receipt in {out}")
            legs += sealed
        if planned:
            context.log.info(f"{request.item.value}: {len(planned)} leg(s) sealed in {duration(time.monotonic() - started)}")
        return legs


class ReplayLegRunner(LegRunner):
    """Replays committed sealed receipts: every sealed leg under `<receipts_dir>/<track>/` (or,
    when there is no such folder, under `<receipts_dir>/`) whose leg.json names the item, in
    any layout (`<item>/<leg>/` or flat `<item>_<arm>_r1_c8/`). Nothing re-runs; a broken seal
    is caught by the receipt-integrity check and the judge, not hidden here."""

    receipts_dir: str = Field(description="folder of committed sealed receipts, or an archive of one "
                                          "(.tar.xz/.tgz: unpacked once into $TICA_RECEIPTS_CACHE, tica.receipt_archive)")

    def track_folder(self, track: str) -> Path:
        root = Path(self.receipts_dir)
        if is_archive(root):
            root = unpacked(root)
        return root / track if (root / track).is_dir() else root

    def run_legs(self, context: AssetExecutionContext, request: LegRequest) -> list[Path]:
        batches = self.run_batches(context, request)
        return list(batches[-1].legs) if batches else []

    def run_batches(self, context: AssetExecutionContext, request: LegRequest) -> list[LegBatch]:
        if request.item is EvidenceItem.ARTIFACTS:
            return [LegBatch(legs=[])]
        folder = self.track_folder(request.track)
        chosen = replay_selection(folder, request.item)
        if chosen is None:
            batches = [LegBatch(legs=[leg for leg in sealed_leg_dirs(folder) if leg_item(leg) == request.item.value])]
            how = "found by their leg.json"
        else:
            batches = chosen
            how = f"as {folder / REPLAY_FILE} selects ({len(batches)} run(s), oldest first)"
        for b in batches:
            context.log.info(f"replaying {len(b.legs)} sealed leg(s) of {request.item.value}"
                             f"{' from ' + b.label if b.label else ''} in {folder}, {how}")
        return batches


REPLAY_FILE = "replay.yaml"


def _globbed(folder: Path, path: Path, where: str, patterns: list) -> list[Path]:
    legs: list[Path] = []
    for pattern in patterns:
        matches = sorted(p for p in folder.glob(str(pattern)) if (p / SEAL_FILE).is_file())
        if not matches:
            raise ReceiptError(path, where, f"{pattern!r} matches no sealed leg under {folder}")
        legs += [m for m in matches if m not in legs]
    return legs


def replay_selection(folder: Path, item: EvidenceItem) -> list[LegBatch] | None:
    """The runs `<folder>/replay.yaml` names for an item, oldest first, or None where the file
    or the item is absent. An item maps to a list of leg globs (one run), or to a list of runs
    `{run: NAME, legs: [globs], reason: WHY}`: every committed run is replayed, failures kept,
    each later run judged as a rerun of the one before it, for the reason it gives (required).
    A folder of receipts often holds more than one answer (kept failures, canaries, probes): the
    file says which legs are the evidence, in a reviewed, committed place."""
    path = folder / REPLAY_FILE
    if not path.is_file():
        return None
    try:
        table = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ReceiptError(path, "<yaml>", f"malformed YAML: {err}") from None
    if not isinstance(table, dict):
        raise ReceiptError(path, "<root>", "must map evidence items to lists of leg folders or runs")
    unknown = sorted(set(table) - {i.value for i in EvidenceItem})
    if unknown:
        raise ReceiptError(path, unknown[0], "is not an evidence item")
    if item.value not in table:
        return None
    entries = table[item.value] or []
    if not isinstance(entries, list):
        raise ReceiptError(path, item.value, "must be a list")
    if not any(isinstance(e, dict) for e in entries):
        return [LegBatch(legs=_globbed(folder, path, item.value, entries))]
    batches: list[LegBatch] = []
    for n, entry in enumerate(entries):
        where = f"{item.value}[{n}]"
        if not isinstance(entry, dict) or set(entry) - {"run", "legs", "reason"} or "run" not in entry:
            raise ReceiptError(path, where, "a run is {run: NAME, legs: [globs], reason: WHY}")
        reason = entry.get("reason")
        if batches and not (isinstance(reason, str) and reason.strip()):
            raise ReceiptError(path, f"{where}.reason", "a later run reruns the one before it: say why")
        batches.append(LegBatch(legs=_globbed(folder, path, where, list(entry.get("legs") or [])),
                                label=str(entry["run"]), rerun_reason=reason))
    return batches


def leg_item(leg: Path) -> str | None:
    """The item a leg says it is (leg.json), else the name of the folder it sits in."""
    try:
        return json.loads((leg / LEG_FILE).read_text()).get("item")
    except (OSError, ValueError, AttributeError):
        return leg.parent.name


TRAINERS = ("vllm_kernels", "megatron", "transformers", "external")


def trainer_flag(trainer: str) -> str | None:
    """The producer's --trainer for the manifest's runner.trainer (e.g. megatron-core==0.16.1)."""
    return next((t for t in TRAINERS if t in trainer.replace("-core", "")), None)


def leg_params(spec: LegSpec, request: LegRequest) -> dict:
    """The producer's flags for one leg (`tica.legs.<item> --key value`), from the manifest and
    the frozen question."""
    m = request.manifest.manifest
    item = request.item
    params: dict = {"model": str(request.manifest.checkpoint_path)}
    if item in (EvidenceItem.FORWARD, EvidenceItem.BACKWARD, EvidenceItem.UPDATE):
        params["trainer"] = trainer_flag(m.runner.trainer)
    criteria = request.question.criteria
    if item is EvidenceItem.FORWARD:
        params["steps"] = criteria.min_steps
    if item in (EvidenceItem.FORWARD, EvidenceItem.UPDATE, EvidenceItem.QUALITY, EvidenceItem.THROUGHPUT,
                EvidenceItem.CLEAN_EXIT):
        params["shutdown_timeout"] = m.recipe.shutdown_timeout  # None: the producer's default, which it records
    if item is EvidenceItem.QUALITY:
        params["length_cap"] = m.eval_contract.length_cap
        params["limit"] = criteria.expected_problems
    if item is EvidenceItem.THROUGHPUT and isinstance(criteria, ThroughputCriteria):
        params.update(
            round=spec.round, slot=spec.slot, concurrencies=list(criteria.concurrencies),
            input_len=criteria.input_len, output_len=criteria.output_len,
            num_prompts=dict(criteria.num_prompts) if criteria.num_prompts else m.workload.num_prompts,
            num_warmups=criteria.warmups,
        )
    return {k: v for k, v in params.items() if v is not None}
