"""Device proof of `LocalGpuLegRunner`: the H200 producers run on the GPU through Dagster Pipes,
each producer command on devices leased from one GPU pool, two legs at once on two GPUs.

    PYTHONPATH=$PWD:/tmp/site:/tmp/dsite python3 scripts/h200/pipes_gpu_proof.py --out $OUT --steps 2
    .venv/bin/python scripts/h200/pipes_gpu_proof.py --dry-run --out /tmp/proof   # here, on the CPU

A temporary DAGSTER_HOME; one Dagster run of two assets with no dependency between them, under the
multiprocess executor (each step its own process, as `dagster dev` runs them):
  forward  make-model (mid4) -> bi1 -> bi0     update  make-model (mid4) -> bi1
Each producer command is a Pipes child on its own lease from the pool of every GPU nvidia-smi
lists (--dry-run: two pretend devices and the producers' CPU dry run). With two GPUs the two
assets' legs run at the same time on different devices; with one, the second waits its turn.

Written under --out ($OUT): summary.json (leases, waits, overlaps, child exits, what each child
saw of CUDA, Pipes log-line counts, materialization metadata, checks), events.jsonl (the run's
event log), legs.tgz (sealed legs + each step's gpu_lease.json and report.json), logs.tgz
(producer output). Exit 0 when every check holds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tarfile
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the step processes import this file by path
    sys.path.insert(0, str(ROOT))

ENV = "TICA_PIPES_GPU_PROOF"
ITEMS = ("forward", "update")
MANIFEST = ROOT / "demo" / "candidates" / "h200-mid4.yaml"
QUESTIONS = ROOT / "demo" / "questions" / "h200-mid4"
PROVENANCE = {"dagster": "dagster", "dagster_pipes": "dagster-pipes", "dagster_shared": "dagster-shared",
              "sqlalchemy": "sqlalchemy", "alembic": "alembic", "pydantic": "pydantic",
              "pydantic_core": "pydantic-core", "grpc": "grpcio", "google.protobuf": "protobuf", "torch": "torch",
              "vllm": "vllm"}


# ---------------------------------------------------------------- the job (rebuilt in each step process)
def proof_job():
    from dagster import Definitions, MaterializeResult, MetadataValue, asset, define_asset_job, multiprocess_executor

    from resources.gpu import LocalGpuLegRunner
    from resources.legs import LegRequest
    from tica.evidence import EvidenceItem
    from tica.manifest import load_manifest
    from tica.question import load_question

    config = json.loads(os.environ[ENV])

    def leg_asset(item: str):
        @asset(name=item, required_resource_keys={"gpu"})
        def _legs(context):
            request = LegRequest(track="h200-mid4", item=EvidenceItem(item),
                                 question=load_question(QUESTIONS / f"{item}.yaml"),
                                 manifest=load_manifest(MANIFEST), candidate_id="pipes-gpu-proof",
                                 out_dir=Path(config["work"]) / item)
            legs = context.resources.gpu.run_legs(context, request)
            return MaterializeResult(metadata={"leg_dirs": MetadataValue.json([str(p) for p in legs])})

        return _legs

    defs = Definitions(
        assets=[leg_asset(item) for item in ITEMS],
        resources={"gpu": LocalGpuLegRunner(**config["runner"])},
        jobs=[define_asset_job("pipes_gpu_proof", selection=list(ITEMS))],
        executor=multiprocess_executor.configured({"max_concurrent": config["concurrency"]}),
    )
    return defs.resolve_job_def("pipes_gpu_proof")


# ---------------------------------------------------------------- reading what happened
def provenance() -> dict:
    """Where each package this run depends on comes from (found, not imported: vLLM stays out of
    this process)."""
    from importlib import metadata
    from importlib.util import find_spec

    out: dict = {"python": sys.version.split()[0], "executable": sys.executable}
    for module, dist in PROVENANCE.items():
        try:
            spec = find_spec(module)
        except (ImportError, ValueError):
            spec = None
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            version = None
        out[module] = {"version": version, "file": spec.origin if spec else None}
    return out


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def concurrent_pairs(leases: list) -> list[dict]:
    """Pairs of leases on different devices that were held at the same time."""
    out = []
    for i, a in enumerate(leases):
        for b in leases[i + 1:]:
            start, end = max(_ts(a.acquired_at), _ts(b.acquired_at)), min(_ts(a.released_at), _ts(b.released_at))
            if end > start and not set(a.indices) & set(b.indices):
                out.append({"first": a.holder, "first_devices": a.indices, "second": b.holder,
                            "second_devices": b.indices, "overlap_s": round(end - start, 3)})
    return out


def event_records(instance, run_id: str) -> list[dict]:
    rows = []
    for e in instance.all_logs(run_id):
        rows.append({"time": e.timestamp, "step": e.step_key, "level": e.level,
                     "event": e.dagster_event_type.value if e.dagster_event_type else None,
                     "message": e.user_message})
    return rows


def materialization_metadata(instance) -> dict:
    from dagster import AssetKey

    out = {}
    for item in ITEMS:
        event = instance.get_latest_materialization_event(AssetKey(item))
        mat = event.asset_materialization if event else None
        out[item] = {k: getattr(v, "value", str(v)) for k, v in (mat.metadata if mat else {}).items()}
    return out


def bitwise_steps(leg: Path) -> list[dict]:
    path = leg / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{"step": r.get("step"), "n_tokens": r.get("tica/n_tokens"), "n_bitwise_diff": r.get("tica/n_bitwise_diff")}
            for r in rows if "tica/n_bitwise_diff" in r]


def pack(out: Path, work: Path) -> None:
    with tarfile.open(out / "legs.tgz", "w:gz") as tf:
        for step in sorted(p.parent for p in work.rglob("report.json")):
            rel = step.relative_to(work)
            for name in ("report.json", "gpu_lease.json"):
                if (step / name).is_file():
                    tf.add(step / name, arcname=str(rel / name))
            if (step / "legs").is_dir():
                tf.add(step / "legs", arcname=str(rel / "legs"))
    with tarfile.open(out / "logs.tgz", "w:gz") as tf:
        for log in sorted(work.rglob("producer.log")):
            tf.add(log, arcname=str(log.relative_to(work)))


# ---------------------------------------------------------------- what the folders hold
def from_disk(legs_root: Path) -> dict:
    """Leases, child reports and legs as they lie (also what a deadline leaves behind)."""
    from tica.gpu_pool import GpuLease, overlapping_leases
    from tica.seal import check_seal

    leases = [GpuLease.model_validate_json(p.read_text()) for p in sorted(legs_root.rglob("gpu_lease.json"))]
    reports = {str(p.parent.relative_to(legs_root)): json.loads(p.read_text())
               for p in sorted(legs_root.rglob("report.json"))}
    legs = [Path(p) for r in reports.values() for p in r.get("legs", [])]
    fields = ("name", "rc", "pid", "seconds", "cuda_visible_devices", "vllm_batch_invariant", "tica_n_steps",
              "progress_lines", "device_check", "stopped", "stragglers_killed")
    return {
        "_leases": leases, "_reports": reports, "_legs": legs,
        "leases": [{"holder": x.holder, "devices": x.indices, "uuids": [d.uuid for d in x.devices],
                    "cuda_visible_devices": x.cuda_visible_devices, "pid": x.pid, "asked_at": x.asked_at,
                    "acquired_at": x.acquired_at, "released_at": x.released_at, "waited_s": x.waited_s,
                    "held_s": x.held_s, "waited_on": [w.holder for w in x.waited_on]} for x in leases],
        "same_device_overlaps": [o.model_dump() for o in overlapping_leases(leases)],
        "concurrent_on_different_devices": concurrent_pairs([x for x in leases if x.released_at]),
        "children": {k: {f: r.get(f) for f in fields} | {"legs": [Path(p).name for p in r.get("legs", [])]}
                     for k, r in reports.items()},
        "seals_broken": {str(leg): problems for leg in legs if (problems := check_seal(leg))},
        "bitwise": {f"{leg.parent.parent.relative_to(legs_root)}/{leg.name}": bitwise_steps(leg)
                    for leg in legs if leg.name.startswith("forward_bi")},
    }


def checks_of(summary: dict, disk: dict, n_devices: int, dry_run: bool) -> dict:
    leases, reports, legs = disk["_leases"], disk["_reports"], disk["_legs"]
    bi1 = [x for x in leases if x.holder.endswith(" bi1") and x.released_at]
    by_step = summary.get("pipes_log_lines", {}).get("by_step", {})
    return {
        "run_succeeded": summary.get("run", {}).get("success", False),
        "every_child_exited_0": bool(reports) and all(r.get("rc") == 0 for r in reports.values()),
        "no_device_held_by_two_leases_at_once": not disk["same_device_overlaps"],
        "pipes_log_lines_arrived_from_every_asset": all(by_step.get(s, 0) > 0 for s in ITEMS),
        "every_leg_sealed": bool(legs) and not disk["seals_broken"],
        "children_saw_exactly_their_lease": None if dry_run else bool(reports) and all(
            (r.get("device_check") or {}).get("ok") for r in reports.values()),
        "two_bi1_legs_at_once_on_different_devices": None if n_devices < 2 else bool(concurrent_pairs(bi1)),
        "a_leg_waited_its_turn": None if n_devices > 1 else any(x.waited_s > 1 for x in leases),
    }


def write_out(out: Path, work: Path, summary: dict, n_devices: int, dry_run: bool, t0: float) -> bool:
    disk = from_disk(work / "legs")
    summary.update({k: v for k, v in disk.items() if not k.startswith("_")})
    summary["checks"] = checks_of(summary, disk, n_devices, dry_run)
    summary["ok"] = not summary.get("timed_out") and all(v for v in summary["checks"].values() if v is not None)
    summary["total_s"] = round(time.time() - t0, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    pack(out, work / "legs")
    print(json.dumps({"ok": summary["ok"], "checks": summary["checks"], "total_s": summary["total_s"],
                      "leases": [(x["holder"], x["devices"], x["waited_s"], x["held_s"]) for x in summary["leases"]],
                      "concurrent": summary["concurrent_on_different_devices"],
                      "failures": [f[:500] for f in summary.get("failures", [])]}, indent=1, default=str), flush=True)
    return summary["ok"]


def kill_descendants() -> None:
    """SIGKILL every process this one started (step processes, Pipes children, producers)."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(text[text.rfind(")") + 2:].split()[1])
    todo, mine = [os.getpid()], []
    while todo:
        pid = todo.pop()
        kids = [k for k, p in parent.items() if p == pid]
        mine += kids
        todo += kids
    for pid in mine:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--work", default="", help="legs, models, the DAGSTER_HOME (default: a new temporary folder)")
    ap.add_argument("--steps", type=int, default=2, help="TICA_N_STEPS: forward steps before and after the update")
    ap.add_argument("--shape", default="", help="model shape (default mid4; tiny with --dry-run)")
    ap.add_argument("--dry-run", action="store_true", help="CPU: the producers' --dry-run on pretend devices")
    ap.add_argument("--pretend-devices", type=int, default=2, help="with --dry-run: how many devices the pool has")
    ap.add_argument("--producer-timeout", type=float, default=300.0, help="seconds one producer command may run")
    ap.add_argument("--deadline", type=float, default=500.0,
                    help="seconds after which what exists is written out and the proof stops (a device call's limit)")
    ap.add_argument("--producer-module", default="", help="module run in place of the producers (tests)")
    a = ap.parse_args(argv)
    t0 = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work or tempfile.mkdtemp(prefix="tica-pipes-gpu-"))
    (work / "legs").mkdir(parents=True, exist_ok=True)
    home = work / "dagster_home"
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    os.environ["DAGSTER_HOME"] = str(home)
    summary: dict = {"dry_run": a.dry_run, "steps": a.steps, "work": str(work), "imports": provenance()}

    from tica.gpu_pool import discover_gpus

    if a.dry_run:
        devices = list(range(a.pretend_devices))
        summary["devices"] = [{"index": i, "uuid": None, "name": "pretend (dry run)"} for i in devices]
    else:
        found = discover_gpus()
        devices = [d.index for d in found]
        summary["devices"] = [d.model_dump() for d in found]
    runner = {"devices": devices, "lock_dir": str(work / "gpu_locks"),
              "build_model": a.shape or ("tiny" if a.dry_run else "mid4"), "n_steps": a.steps, "dry_run": a.dry_run,
              "check_device": not a.dry_run, "share_within_run": False, "producer_timeout_s": a.producer_timeout,
              "producer_module": a.producer_module}
    # two steps at once whatever the pool: on one GPU the pool, not the executor, makes them take turns
    os.environ[ENV] = json.dumps({"work": str(work / "legs"), "runner": runner, "concurrency": 2})
    summary["runner"] = runner
    print(f"[proof] {len(devices)} device(s) {devices}; work {work}", flush=True)

    def on_deadline() -> None:
        summary["timed_out"] = f"deadline {a.deadline:g} s: the run did not finish; what it left is reported"
        summary["held_at_deadline"] = {p.name: p.read_text() for p in sorted((work / "gpu_locks").glob("*.lock"))}
        kill_descendants()
        write_out(out, work, summary, len(devices), a.dry_run, t0)
        os._exit(2)

    watchdog = threading.Timer(a.deadline, on_deadline)
    watchdog.daemon = True
    watchdog.start()

    from dagster import DagsterEventType, DagsterInstance, execute_job, reconstructable

    steps = (DagsterEventType.STEP_START.value, DagsterEventType.STEP_SUCCESS.value,
             DagsterEventType.STEP_FAILURE.value)
    with DagsterInstance.get() as instance:
        with execute_job(reconstructable(proof_job), instance=instance) as result:
            run_id, success = result.run_id, result.success
        events = event_records(instance, run_id)
        summary["run"] = {"run_id": run_id, "success": success, "seconds": round(time.time() - t0, 1)}
        timing: dict[str, dict] = {}
        for e in events:
            if e["event"] in steps:
                timing.setdefault(e["step"], {})[e["event"]] = e["time"]
        summary["steps_timing"] = timing
        summary["failures"] = [e["message"] for e in events if e["event"] == DagsterEventType.STEP_FAILURE.value]
        summary["materializations"] = materialization_metadata(instance)
    watchdog.cancel()
    with open(out / "events.jsonl", "w") as f:
        for row in events:
            f.write(json.dumps(row, default=str) + "\n")
    pipes_lines = [e for e in events if (e["message"] or "").startswith("pipes[")]
    summary["pipes_log_lines"] = {"total": len(pipes_lines),
                                  "by_step": {s: sum(e["step"] == s for e in pipes_lines) for s in ITEMS}}
    return 0 if write_out(out, work, summary, len(devices), a.dry_run, t0) else 1


if __name__ == "__main__":
    sys.exit(main())
