"""`LocalGpuLegRunner`: the H200 producers on a GPU of this machine, through Dagster Pipes.

For a user's own GPU box. Every producer command (`make-model`, `bi1`, `bi0` of
`tica.legs.vllm_kernels.producers`) runs as a Pipes child (`tica.legs.vllm_kernels.pipes_child`)
on devices leased from one machine-wide GPU pool (`tica.gpu_pool`): the child's
`CUDA_VISIBLE_DEVICES` is its lease, `VLLM_BATCH_INVARIANT` its arm, and no other leg gets those
devices until the producer has exited. The lease record goes beside the legs
(`<step>/gpu_lease.json`) and into the asset's metadata; the sealed receipts are not touched.

Items map to the producers' legs (the same selection the replayed H200 track judges):
forward = `bi1`'s forward_bi1_decode + forward_bi1_decode_post_update, `bi0`'s forward_bi0_hf
and, with `bi0_megatron` (megatron-core on the box), `bi0-megatron`'s forward_bi0_megatron over
bi0's rollouts; backward = `bi1`'s backward_bi1; update = `bi1`'s update_bi1. One `bi1` run
measures all three, so by default each producer command runs once per Dagster run and the
items of that run share its legs.

With more than one GPU, raise the instance's `gpu` pool limit (dagster.yaml) to the number of
devices so that many leg assets may run at once; the GPU pool then decides which device each gets.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dagster import AssetExecutionContext, Failure, MetadataValue, PipesSubprocessClient
from pydantic import BaseModel, Field

from resources.dagster_compat import DagsterPipesExecutionError
from resources.legs import PROJECT_ROOT, LegRequest, LegRunner
from tica.evidence import EvidenceItem
from tica.gpu_pool import (
    DEFAULT_LOCK_DIR,
    GpuDevice,
    GpuLease,
    GpuPool,
    GpuPoolBusy,
    GpuPoolConfig,
    GpuPoolError,
    NoGpuFound,
    discover_gpus,
)

E = EvidenceItem
# Which sealed legs of which producer command are an item's evidence.
ITEM_LEGS: dict[EvidenceItem, dict[str, tuple[str, ...]]] = {
    E.FORWARD: {"bi1": ("forward_bi1_decode", "forward_bi1_decode_post_update"), "bi0": ("forward_bi0_hf",)},
    E.BACKWARD: {"bi1": ("backward_bi1",)},
    E.UPDATE: {"bi1": ("update_bi1",)},
}
# Items with no legs of their own: they judge the legs of the items they cover.
NO_OWN_LEGS = (E.CLEAN_EXIT, E.ARTIFACTS)
CHILD_MODULE = "tica.legs.vllm_kernels.pipes_child"
MODEL_STEP = "make-model"


class ProducerRun(BaseModel):
    """One producer command: its lease and what its Pipes child reported."""

    name: str
    step_dir: str
    rc: int | None
    legs: list[str]
    lease: GpuLease | None
    report: dict = Field(default_factory=dict)
    reused: bool = False

    def summary(self) -> dict:
        lease = self.lease
        return {
            "name": self.name, "rc": self.rc, "reused": self.reused, "pid": self.report.get("pid"),
            "seconds": self.report.get("seconds"), "legs": [Path(p).name for p in self.legs],
            "cuda_visible_devices": self.report.get("cuda_visible_devices"),
            "vllm_batch_invariant": self.report.get("vllm_batch_invariant"),
            "device_check_ok": (self.report.get("device_check") or {}).get("ok"),
            "progress_lines": self.report.get("progress_lines"),
            "lease": None if lease is None else {
                "devices": lease.indices, "uuids": [d.uuid for d in lease.devices], "holder": lease.holder,
                "waited_s": lease.waited_s, "held_s": lease.held_s, "acquired_at": lease.acquired_at,
                "released_at": lease.released_at},
        }


@contextmanager
def step_lock(path: Path) -> Iterator[None]:
    """Exclusive use of one producer step's folder (the other items of the run wait, on no GPU)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class LocalGpuLegRunner(LegRunner):
    """The H200 producers on this machine's GPUs, each command a Pipes child on its own lease."""

    devices: list[int] | None = Field(
        None, description="GPU indices of the pool (nvidia-smi's numbering); None: every GPU nvidia-smi lists")
    lock_dir: str = Field("", description=f"the pool's lock files; empty = {DEFAULT_LOCK_DIR} (machine-wide)")
    gpus_per_leg: int = Field(1, ge=1, description="devices leased to each producer command")
    wait_timeout_s: float = Field(3600.0, ge=0, description="how long a leg waits for its devices")
    producer_timeout_s: float = Field(1800.0, gt=0, description="a producer command past this is stopped")
    build_model: str = Field(
        "", description="a producers SHAPES name (mid4): build the seeded model the H200 track used instead "
                        "of reading the manifest's checkpoint.path")
    n_steps: int | None = Field(None, ge=1, description="TICA_N_STEPS for the producers (default theirs: 5)")
    dry_run: bool = Field(False, description="pass --dry-run: CPU, tiny reference kernels, fake rollout (tests)")
    check_device: bool = Field(True, description="before each producer, check CUDA sees exactly the lease")
    share_within_run: bool = Field(True, description="run each producer command once per Dagster run")
    bi0_megatron: bool = Field(False, description="forward: also megatron-core's BI=0 trainer (bi0-megatron)")
    producer_module: str = Field("", description="module run in place of the producers (tests)")

    def pool(self) -> GpuPool:
        lock_dir = Path(self.lock_dir) if self.lock_dir else DEFAULT_LOCK_DIR
        return GpuPool(GpuPoolConfig(devices=self.pool_devices(), lock_dir=lock_dir,
                                     wait_timeout_s=self.wait_timeout_s))

    def pool_devices(self) -> list[GpuDevice]:
        """The configured indices (with their UUIDs where nvidia-smi answers), or every GPU it lists."""
        if self.devices is None:
            return discover_gpus()
        if not self.devices:
            raise NoGpuFound("LocalGpuLegRunner.devices is empty: list GPU indices, or leave it unset to discover")
        try:
            found = {d.index: d for d in discover_gpus()}
        except NoGpuFound:
            return [GpuDevice(index=i) for i in self.devices]  # dry runs and tests: no nvidia-smi
        missing = [i for i in self.devices if i not in found]
        if missing:
            raise NoGpuFound(f"LocalGpuLegRunner.devices: GPU {missing} not among nvidia-smi's {sorted(found)}")
        return [found[i] for i in self.devices]

    # ------------------------------------------------------------------ one producer command
    def run_producer(self, context: AssetExecutionContext, name: str, args: list[str], step_dir: Path,
                     arm: str | None = None) -> ProducerRun:
        """Lease, launch `name` (`producers <args>`) as a Pipes child, collect its report. A step
        that already ran in this folder (another item of the run) is reused as it ended."""
        with step_lock(step_dir.parent / f".{step_dir.name}.lock"):
            if (step_dir / "report.json").is_file():
                run = self._reused(step_dir, name)
                context.log.info(f"{name}: already ran in {step_dir} (rc {run.rc}); its legs are reused")
                return run
            step_dir.mkdir(parents=True, exist_ok=True)
            holder = f"run {context.run.run_id[:8]} {_asset_name(context)} {name}"
            held: list[GpuLease] = []
            try:
                with self.pool().lease(self.gpus_per_leg, holder) as lease:
                    held.append(lease)
                    on = f" on {lease.waited_on[0].holder}" if lease.waited_on else ""
                    context.log.info(f"{name}: leased GPU {lease.cuda_visible_devices} after waiting "
                                     f"{lease.waited_s:.1f} s{on}")
                    report = self._launch(context, name, args, step_dir, arm, lease)
            except GpuPoolBusy as err:
                raise Failure(description=str(err), metadata={
                    "busy": MetadataValue.json([b.model_dump() for b in err.busy])}) from None
            except GpuPoolError as err:  # too small a pool, no GPU found: it could never run here
                raise Failure(description=str(err) if holder in str(err) else f"{holder}: {err}") from None
            finally:
                if held:  # complete once the lease has ended, whatever the producer did
                    (step_dir / "gpu_lease.json").write_text(held[0].model_dump_json(indent=1))
            context.log.info(f"{name}: released GPU {lease.cuda_visible_devices} after {lease.held_s:.1f} s")
            return ProducerRun(name=name, step_dir=str(step_dir), rc=report.get("rc"), legs=report.get("legs", []),
                               lease=lease, report=report)

    def _launch(self, context, name: str, args: list[str], step_dir: Path, arm: str | None, lease: GpuLease) -> dict:
        from tica.legs.runner import leg_env  # standard library only

        env = leg_env(arm or "bi0")
        if arm is None:  # make-model: no arm, no switch
            env.pop("VLLM_BATCH_INVARIANT")
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the producers hold vLLM's engine in-process
        env.update(lease.child_env())
        if self.n_steps is not None:
            env["TICA_N_STEPS"] = str(self.n_steps)
        report_path = step_dir / "report.json"
        command = [sys.executable, "-m", CHILD_MODULE, "--name", name,
                   "--legs", str(step_dir / "legs"), "--report", str(report_path),
                   "--log", str(step_dir / "producer.log"), "--timeout", str(self.producer_timeout_s)]
        if self.check_device and not self.dry_run:
            command.append("--check-device")
        if self.producer_module:
            command += ["--producer-module", self.producer_module]
        command += ["--", *args, *(["--dry-run"] if self.dry_run and name != MODEL_STEP else [])]
        context.log.info(f"{name}: {' '.join(command[3:])}")
        client = PipesSubprocessClient(cwd=str(PROJECT_ROOT))
        try:
            invocation = client.run(context=context, command=command, env=env)
            messages = invocation.get_custom_messages()
        except DagsterPipesExecutionError as err:
            report = json.loads(report_path.read_text()) if report_path.is_file() else {}
            raise Failure(description=f"{name}: the Pipes child failed ({err}): "
                                      f"{report.get('error') or 'see its log'}; log {step_dir / 'producer.log'}",
                          metadata={"report": MetadataValue.json(report)}) from None
        if not messages:
            raise Failure(description=f"{name}: the Pipes child sent no report; log {step_dir / 'producer.log'}")
        return messages[-1]

    def _reused(self, step_dir: Path, name: str) -> ProducerRun:
        report = json.loads((step_dir / "report.json").read_text())
        lease_path = step_dir / "gpu_lease.json"
        lease = GpuLease.model_validate_json(lease_path.read_text()) if lease_path.is_file() else None
        return ProducerRun(name=name, step_dir=str(step_dir), rc=report.get("rc"), legs=report.get("legs", []),
                           lease=lease, report=report, reused=True)

    # ------------------------------------------------------------------ an evidence item
    def session_dir(self, context: AssetExecutionContext, request: LegRequest) -> Path:
        if not self.share_within_run:
            return request.out_dir
        # beside the items' own folders of this candidate: legs/<track>/<candidate>/vllm_kernels/<run>
        return request.out_dir.parent.parent / "vllm_kernels" / context.run.run_id[:8]

    def run_legs(self, context: AssetExecutionContext, request: LegRequest) -> list[Path]:
        item = request.item
        if item in NO_OWN_LEGS:
            context.log.info(f"{item.value}: no legs of its own; it judges the legs of the items it covers")
            return []
        if item not in ITEM_LEGS:
            raise Failure(description=(
                f"LocalGpuLegRunner runs the vllm_kernels producers' forward, backward and update legs; "
                f"{item.value} has no producer command here (throughput: `producers all --throughput`, then "
                "judge its sealed receipts with ReplayLegRunner; quality: CpuLegRunner)"))
        session = self.session_dir(context, request)
        runs: list[ProducerRun] = []
        model, model_note = self._model(context, request, session, runs)
        wanted = ITEM_LEGS[item]
        arms = [a for a in request.question.round_arms(1) if a in wanted]  # the frozen first order
        legs: list[Path] = []
        rollouts = session / "bi0" / "rollouts.json"  # bi0's rollouts, which bi0-megatron scores
        for arm in arms:
            step = session / arm
            args = [arm, "--model", str(model), "--legs", str(step / "legs"), "--work", str(step / "work")]
            if arm == "bi1":
                args += ["--shape", self.build_model or "candidate-checkpoint"]
            else:
                args += ["--rollouts", str(rollouts)]
            run = self.run_producer(context, arm, args, step, arm=arm)
            runs.append(run)
            legs += self._item_legs(context, run, wanted[arm])
        if item is E.FORWARD and self.bi0_megatron:
            step = session / "bi0-megatron"
            args = ["bi0-megatron", "--model", str(model), "--legs", str(step / "legs"), "--rollouts", str(rollouts)]
            run = self.run_producer(context, "bi0-megatron", args, step, arm="bi0")
            runs.append(run)
            legs += self._item_legs(context, run, ("forward_bi0_megatron",))
        self._record(context, runs, model_note)
        return legs

    def _model(self, context, request: LegRequest, session: Path, runs: list[ProducerRun]) -> tuple[Path, dict]:
        if not self.build_model:
            if request.manifest.checkpoint_path is None:
                raise Failure(description=(
                    f"{request.manifest.path}: checkpoint: a digest recorded elsewhere, with no path to read; "
                    "give the manifest a checkpoint.path, or set LocalGpuLegRunner.build_model to the "
                    "producers' shape (mid4) to build the seeded model the H200 track used"))
            return request.manifest.checkpoint_path, {"model": str(request.manifest.checkpoint_path),
                                                     "source": "the manifest's checkpoint.path"}
        step = session / MODEL_STEP
        model = session / "model"
        args = [MODEL_STEP, "--out", str(model), "--shape", self.build_model, "--seed", "1",
                "--device", "cpu" if self.dry_run else "cuda"]
        run = self.run_producer(context, MODEL_STEP, args, step)
        runs.append(run)
        info_path = model / "tica_model.json"
        if run.rc != 0 or not info_path.is_file():
            raise Failure(description=f"{MODEL_STEP} exited {run.rc} without a model in {model}; "
                                      f"log {step / 'producer.log'}")
        from tica.models.hashing import weights_hash

        built = {**json.loads(info_path.read_text()), "weights_hash": weights_hash(model)}  # the core's fingerprint
        recorded = request.manifest.manifest.checkpoint.digest
        note = {"model": str(model), "source": f"built: producers make-model --shape {self.build_model} --seed 1",
                "weights_hash": built.get("weights_hash"), "manifest_digest": recorded,
                "matches_manifest": None if recorded is None else built.get("weights_hash") == recorded}
        if recorded is not None and not note["matches_manifest"]:
            # Not only a warning: tica.binding refuses every leg of these weights as evidence for this candidate.
            context.log.warning(f"{MODEL_STEP}: built weights {built.get('weights_hash')} differ from the manifest's "
                                f"recorded checkpoint {recorded}: its legs are not evidence for this candidate")
        return model, note

    def _item_legs(self, context, run: ProducerRun, names: tuple[str, ...]) -> list[Path]:
        sealed = {Path(p).name: Path(p) for p in run.legs}
        missing = [n for n in names if n not in sealed]
        log = Path(run.step_dir) / "producer.log"
        if missing:
            tail = log.read_text(errors="replace")[-2000:] if log.is_file() else ""
            raise Failure(description=f"{run.name} exited {run.rc} and left no sealed {', '.join(missing)} in "
                                      f"{run.step_dir}/legs; log {log}\n{tail}")
        if run.rc != 0:  # a failed producer that sealed its legs is evidence, kept as is
            context.log.warning(f"{run.name} exited {run.rc} but sealed {', '.join(names)}; log {log}")
        return [sealed[n] for n in names]

    def _record(self, context, runs: list[ProducerRun], model_note: dict) -> None:
        own = [r.lease for r in runs if r.lease is not None and not r.reused]
        devices = sorted({r.lease.cuda_visible_devices for r in runs if r.lease})
        context.add_asset_metadata({
            "gpu_devices": MetadataValue.text(", ".join(devices)),
            "gpu_wait_s": MetadataValue.float(round(sum(lease.waited_s for lease in own), 3)),
            "gpu_leases": MetadataValue.json([r.summary() for r in runs]),
            "model": MetadataValue.json(model_note),
        })


def _asset_name(context: AssetExecutionContext) -> str:
    try:
        return context.asset_key.to_user_string()
    except Exception:  # noqa: BLE001 (a multi-asset, or an op)
        return context.op_def.name
