"""One acceptance track's legs as Ray jobs on this host's GPUs, through Dagster, the ledger on Postgres
(issue 34; `run_h200.sh ray` runs it on a two-GPU machine).

It starts a local Ray cluster (a head with the dashboard, no GPU; one worker node per GPU, that node's
CUDA_VISIBLE_DEVICES its device and its own `tica_node_gpu<index>` resource, as tests/ray/conftest.py
starts its fake ones), starts a Postgres server (or takes --pg-dsn), materializes the track's evidence
with TICA_LEG_RUNNER=ray (resources/ray_legs.py: each leg a Ray job on one node, one GPU), then checks
what came back and stops Ray and Postgres:

  - every leg the runner recorded is a row of the ledger's `legs` table;
  - every sealed leg's receipt names its node (TICA_NODE, TICA_NODE_ID) and its GPU
    (CUDA_VISIBLE_DEVICES, TICA_GPU_UUID: nvidia-smi's UUID or `unknown`), as its `.gpu.json` says;
  - no throughput leg overlapped another leg on one GPU (resources/ray_gpu_check.py).

$OUT gets summary.json (the checks, the verdicts, every Ray job's record) and receipts.tgz (the
sealed legs and the runner's records). Exit 0 only when every check holds; the verdicts are the
ledger's, whatever they are. --fake-gpus is its CPU dry run (Ray's bookkeeping only; pair it with
--producer-module and a test project), the same code otherwise.

State lives in --work (Postgres' data, Dagster's home, the shared receipts folder), so a track split
over several device calls (--items) lands in one ledger: /tmp outlives a call on a warm machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
NODE_PREFIX = "tica_node_"


# ---------------------------------------------------------------------------- Ray
@dataclass
class LocalCluster:
    cluster: Any  # ray.cluster_utils.Cluster
    address: str  # the dashboard's HTTP address
    nodes: dict[str, str] = field(default_factory=dict)  # node name -> its CUDA_VISIBLE_DEVICES

    def stop(self) -> None:
        self.cluster.shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(gpus: list[str], cpus_per_node: int = 4) -> LocalCluster:
    """A head (dashboard, no GPU) and one worker node per GPU index, each seeing that device alone."""
    from ray.cluster_utils import Cluster

    os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH", "")) if x)
    os.environ.pop("RAY_ADDRESS", None)
    port = _free_port()
    # the head's dashboard agent on a free port: its default (52365) is taken by any other cluster on the
    # host, and without that agent the dashboard takes no job
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": 0, "include_dashboard": True, "dashboard_host": "127.0.0.1", "dashboard_port": port,
        "dashboard_agent_listen_port": _free_port()})
    local = LocalCluster(cluster=cluster, address=f"http://127.0.0.1:{port}")
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        for index in gpus:
            # Ray reads the node's devices from its starting environment and hands jobs those indices
            os.environ["CUDA_VISIBLE_DEVICES"] = index
            cluster.add_node(num_cpus=cpus_per_node, num_gpus=1, resources={f"{NODE_PREFIX}gpu{index}": 1})
            local.nodes[f"gpu{index}"] = index
        cluster.wait_for_nodes()
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved
    wait_for_jobs(local.address, [f"{NODE_PREFIX}{n}" for n in local.nodes])
    return local


def wait_for_jobs(address: str, resources: list[str], timeout_s: float = 180.0) -> None:
    """Until a job pinned to each node runs: the dashboard refuses jobs until its agents are up."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address)
    deadline = time.monotonic() + timeout_s
    for res in resources:
        while True:
            try:
                job = client.submit_job(entrypoint="true", entrypoint_resources={res: 0.001})
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
        while str(client.get_job_status(job).value) not in ("SUCCEEDED", "FAILED", "STOPPED"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"a test job on {res} did not end in {timeout_s:g} s")
            time.sleep(0.5)


# ---------------------------------------------------------------------------- Postgres
@dataclass
class LocalPostgres:
    dsn: str
    pg_ctl: str
    data: Path
    user: str | None
    env: dict[str, str]

    def stop(self) -> None:
        subprocess.run(_as(self.user, [self.pg_ctl, "-D", str(self.data), "-m", "fast", "stop"]), capture_output=True,
                       env=self.env)


def _as(user: str | None, cmd: list[str]) -> list[str]:
    return ["runuser", "-u", user, "--", *cmd] if user else cmd


def _server_user() -> str | None:
    """Postgres refuses to run as root: as root it runs as `postgres` where that user exists, else `nobody`."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        pwd.getpwnam("postgres")
        return "postgres"
    except KeyError:
        return "nobody"


def start_postgres(pg_bin: Path, root: Path, lib: Path | None = None) -> LocalPostgres:
    """A Postgres server on loopback (user `tica`, trust auth), its data kept in root/data; `lib`: the
    carried server's shared libraries (its processes alone load them)."""
    user = _server_user()
    env = dict(os.environ)
    if lib is not None:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(x for x in (str(lib), env.get("LD_LIBRARY_PATH", "")) if x)
    root.mkdir(parents=True, exist_ok=True)
    data, port = root / "data", _free_port()
    if user:
        for p in (root, *root.rglob("*")):
            shutil.chown(p, user)
    if not (data / "PG_VERSION").is_file():
        subprocess.run(_as(user, [str(pg_bin / "initdb"), "-D", str(data), "-A", "trust", "-U", "tica", "--no-sync",
                                  "-E", "UTF8"]), check=True, capture_output=True, env=env)
    pg_ctl = str(pg_bin / "pg_ctl")
    subprocess.run(_as(user, [pg_ctl, "-D", str(data), "-l", str(root / "server.log"), "-w", "-o",
                              f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c max_connections=100", "start"]),
                   check=True, capture_output=True, env=env)
    server = f"postgresql://tica@127.0.0.1:{port}"
    import psycopg

    with psycopg.connect(f"{server}/postgres", autocommit=True) as con:
        if not con.execute("SELECT 1 FROM pg_database WHERE datname = 'tica'").fetchone():
            con.execute("CREATE DATABASE tica")
    return LocalPostgres(dsn=f"{server}/tica", pg_ctl=pg_ctl, data=data, user=user, env=env)


# ---------------------------------------------------------------------------- the track
def prepare_project(track: str, model_dir: Path, work: Path) -> tuple[Path, Path]:
    """(candidates, questions): the track's manifest with checkpoint.path the model folder, its frozen questions."""
    import yaml

    manifest = yaml.safe_load((REPO / "demo" / "candidates" / f"{track}.yaml").read_text())
    manifest["checkpoint"]["path"] = str(model_dir.resolve())
    candidates = work / "candidates"
    candidates.mkdir(parents=True, exist_ok=True)
    (candidates / f"{track}.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return candidates, REPO / "demo" / "questions"


@dataclass(frozen=True)
class TrackRun:
    track: str
    candidates_dir: Path
    questions_dir: Path
    work: Path  # data/ (Dagster's home, the legs' data dir) and shared/ (the receipts) live here
    items: tuple[str, ...] = ()  # () = every evidence item
    producer_module: str = ""
    leg_env: dict[str, str] = field(default_factory=dict)
    item_args: dict[str, str] = field(default_factory=dict)
    item_nodes: dict[str, str] = field(default_factory=dict)  # item -> node name (RayLegRunner.item_nodes)
    leg_timeout_s: float = 3600.0

    @property
    def shared(self) -> Path:
        return self.work / "shared"


def runner_for(run: TrackRun, address: str, **kw):
    from resources.ray_legs import RayLegRunner

    # the job's PYTHONPATH replaces the node's: this process's (the kit's site, the carried wheels) goes with it
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), **run.leg_env}
    return RayLegRunner(address=address, shared_dir=str(run.shared), producer_module=run.producer_module,
                        env=env, item_args=run.item_args, item_nodes=run.item_nodes,
                        leg_timeout_s=run.leg_timeout_s,
                        poll_interval_s=0.25, **kw)


def materialize(run: TrackRun, address: str, dsn: str, runner=None) -> bool:
    """The track's evidence job in-process, TICA_LEG_RUNNER=ray; True when Dagster says it succeeded."""
    from dagster import DagsterInstance, build_sensor_context

    from sensors.manifests import SENSOR_NAME
    from tica.evidence import EvidenceItem
    from tica_assets.definitions import build_defs
    from tica_assets.keys import evidence_key, safe_name
    from tica_assets.settings import Settings

    data = run.work / "data"
    settings = Settings.from_env({
        "TICA_LEG_RUNNER": "ray", "TICA_RAY_ADDRESS": address, "TICA_RAY_SHARED_DIR": str(run.shared),
        "TICA_LEDGER": dsn, "TICA_CANDIDATES_DIR": str(run.candidates_dir),
        "TICA_QUESTIONS_DIR": str(run.questions_dir), "TICA_DATA_DIR": str(data)})
    defs = build_defs(settings, resources={"leg_runner": runner or runner_for(run, address)})
    home = data / "dagster"
    home.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    instance = DagsterInstance.from_config(str(home))
    # one manifest-sensor tick, as the daemon would: the candidate's components observed
    sensor = defs.resolve_sensor_def(SENSOR_NAME)
    tick = sensor.evaluate_tick(build_sensor_context(instance=instance, resources={"ledger": defs.resources["ledger"]},
                                                     sensor_name=SENSOR_NAME))
    for event in tick.asset_events:
        instance.report_runless_asset_event(event)
    keys = [evidence_key(run.track, EvidenceItem(i)) for i in run.items] or None
    result = defs.resolve_job_def(f"{safe_name(run.track)}_evidence").execute_in_process(
        instance=instance, raise_on_error=False, asset_selection=keys)
    return bool(result.success)


# ---------------------------------------------------------------------------- the checks
def receipt_problems(leg: Path, gpu: dict | None) -> list[str]:
    """Why a sealed leg's receipt does not name the node and GPU it ran on (empty: it does)."""
    try:
        env = json.loads((leg / "leg.json").read_text()).get("env") or {}
    except (OSError, ValueError) as err:
        return [f"{leg}: leg.json unreadable ({type(err).__name__})"]
    missing = [k for k in ("TICA_NODE", "TICA_NODE_ID") if not env.get(k)]
    if gpu and gpu.get("devices"):
        missing += [k for k in ("CUDA_VISIBLE_DEVICES", "TICA_GPU_UUID") if not env.get(k)]
        if env.get("CUDA_VISIBLE_DEVICES") and env.get("CUDA_VISIBLE_DEVICES") != gpu.get("cuda_visible_devices"):
            return [f"{leg}: its receipt says GPU {env['CUDA_VISIBLE_DEVICES']} but the job saw "
                    f"{gpu.get('cuda_visible_devices')}"]
    elif gpu is None:
        missing.append("the job's GPU record")
    return [f"{leg}: its receipt lacks {', '.join(missing)}"] if missing else []


def verify(run: TrackRun, dsn: str) -> dict[str, Any]:
    """The checks of the module's docstring, read from the shared folder and the ledger."""
    from resources.ray_gpu_check import check, records
    from tica.evidence import EvidenceItem
    from tica.ledger import PostgresLedger

    recs = records(run.shared)
    ledger = PostgresLedger(dsn)
    rows = ledger.rows("SELECT item, arm, status, leg_dir FROM legs")
    in_ledger = {str(Path(r["leg_dir"]).resolve()) for r in rows}
    not_in_ledger, receipts = [], []
    for rec in recs:
        legs = [Path(p) for p in rec.get("sealed_legs") or []]
        if rec.get("failure_record"):
            from resources.legs import sealed_leg_dirs

            legs += sealed_leg_dirs(Path(rec["failure_record"]))
        if not legs:
            not_in_ledger.append(f"{rec.get('item')}/{rec.get('leg')}: no sealed leg at all")
        for leg in legs:
            if str(leg.resolve()) not in in_ledger:
                not_in_ledger.append(f"{leg}: not in the ledger's legs")
            receipts += receipt_problems(leg, rec.get("gpu")) if rec.get("status") not in ("NOT_STARTED",) else []
    wrong_node = [f"{r.get('item')}/{r.get('leg')}: pinned to {r.get('node_id')}, ran on {r.get('ran_on_node_id')}"
                  for r in recs if r.get("ran_on_node_id") and r["ran_on_node_id"] != r.get("node_id")]
    gpus = check(recs)
    wanted = set(run.items) or {i.value for i in EvidenceItem if i is not EvidenceItem.ARTIFACTS}
    no_jobs = sorted(wanted - {str(r.get("item")) for r in recs})
    verdicts = ledger.rows("SELECT track, item, verdict, summary FROM track_verdicts")
    checks = {
        "every_item_ran_jobs": not no_jobs,
        "every_leg_in_ledger": not not_in_ledger,
        "receipts_name_node_and_gpu": not receipts,
        "ran_on_pinned_node": not wrong_node,
        "throughput_legs_alone_on_their_gpu": gpus.ok,
    }
    return {
        "ok": all(checks.values()), "checks": checks, "items_without_jobs": no_jobs, "not_in_ledger": not_in_ledger, "receipt_problems": receipts,
        "wrong_node": wrong_node, "gpu_overlaps": gpus.overlaps, "gpu_unknown": gpus.unknown,
        "ledger_legs": len(rows), "verdicts": [{k: r[k] for k in ("track", "item", "verdict", "summary")} for r in verdicts],
        "ledger_verified": bool(ledger.verify().ok), "ray_jobs": recs,
    }


def write_out(out: Path, run: TrackRun, summary: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    if run.shared.is_dir():
        with tarfile.open(out / "receipts.tgz", "w:gz") as tar:
            tar.add(run.shared, arcname="ray")


# ---------------------------------------------------------------------------- the command
def _pairs(values: list[str]) -> dict[str, str]:
    return dict(v.split("=", 1) for v in values)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--work", type=Path, default=Path("/tmp/tica_ray"))
    ap.add_argument("--track", default="h200-accept", help="demo/candidates/<track>.yaml and its frozen questions")
    ap.add_argument("--model-dir", type=Path, help="the checkpoint (the manifest's checkpoint.path); with --track")
    ap.add_argument("--candidates-dir", type=Path, help="a prepared project's candidates (dry runs), instead of --track's")
    ap.add_argument("--questions-dir", type=Path)
    ap.add_argument("--items", default="", help="evidence items to materialize, comma-separated (default: all)")
    ap.add_argument("--gpus", default="0,1", help="device indices, one Ray worker node each")
    ap.add_argument("--fake-gpus", action="store_true", help="CPU dry run: Ray counts GPUs that are not there")
    ap.add_argument("--pg-bin", type=Path, default=Path("/usr/lib/postgresql/15/bin"))
    ap.add_argument("--pg-lib", type=Path, help="the carried Postgres' shared libraries (build_carries.sh ray)")
    ap.add_argument("--pg-dsn", default="", help="a Postgres database to take instead of starting a server")
    ap.add_argument("--producer-module", default="", help="RayLegRunner.producer_module (dry runs: a stand-in)")
    ap.add_argument("--leg-env", action="append", default=[], help="KEY=VALUE for every leg")
    ap.add_argument("--item-args", action="append", default=[], help="ITEM=FLAGS added to that item's producer")
    ap.add_argument("--leg-timeout", type=float, default=900.0)
    args = ap.parse_args(argv)
    if args.candidates_dir is None and args.model_dir is None:
        ap.error("--model-dir (with --track) or --candidates-dir is needed")
    if not args.fake_gpus and shutil.which("nvidia-smi") is None:
        ap.error("no nvidia-smi: on a CPU-only machine pass --fake-gpus")
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    if args.candidates_dir is not None:
        candidates, questions = args.candidates_dir, args.questions_dir or args.candidates_dir.parent / "questions"
    else:
        candidates, questions = prepare_project(args.track, args.model_dir, work)
    run = TrackRun(track=args.track, candidates_dir=candidates, questions_dir=questions, work=work,
                   items=tuple(i for i in args.items.split(",") if i), producer_module=args.producer_module,
                   leg_env=_pairs(args.leg_env), item_args=_pairs(args.item_args), leg_timeout_s=args.leg_timeout)
    pg = None if args.pg_dsn else start_postgres(args.pg_bin, work / "postgres", args.pg_lib)
    dsn = args.pg_dsn or pg.dsn
    cluster = None
    t0 = time.monotonic()
    try:
        cluster = start_cluster([g for g in args.gpus.split(",") if g])
        started = time.monotonic() - t0
        success = materialize(run, cluster.address, dsn)
        summary = {"dagster_success": success, "cluster_start_s": round(started, 1), "fake_gpus": args.fake_gpus,
                   "nodes": cluster.nodes, **verify(run, dsn)}
    finally:
        if cluster is not None:
            cluster.stop()
        if pg is not None:
            pg.stop()
    summary["seconds"] = round(time.monotonic() - t0, 1)
    summary["ok"] = bool(summary["ok"] and success)  # a Dagster run that failed is no finished track
    write_out(args.out, run, summary)
    print(json.dumps({k: summary[k] for k in ("ok", "checks", "dagster_success", "seconds")}, indent=1))
    for line in summary["not_in_ledger"] + summary["receipt_problems"] + summary["gpu_overlaps"] + summary["gpu_unknown"]:
        print(line, file=sys.stderr)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
