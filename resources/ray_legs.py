"""`RayLegRunner`: TICA's leg producers as Ray jobs on the nodes of a Ray cluster, through
dagster-ray's Pipes support for Ray jobs (dagster-ray 0.4.8, `dagster_ray.core.pipes`).

Why Ray jobs, not plain Ray tasks: dagster-ray's only Pipes client is `PipesRayJobClient`. It
submits a *shell entrypoint* through Ray's job API (`JobSubmissionClient`, the dashboard's HTTP
address), injects the Pipes context as `runtime_env.env_vars`, and reads the child's Pipes
messages by tailing the job's logs (`PipesRayJobMessageReader`). A leg producer already is a shell
command that opens Dagster Pipes itself (`tica.legs.runner.leg_command`), so it becomes the job's
entrypoint unchanged: no TICA code runs inside a Ray worker, the producer imports nothing of Ray
or Dagster, and the orchestrating side needs only the dashboard's address (no Ray driver, no
shared Python objects). Ray places the entrypoint with `entrypoint_num_gpus` and
`entrypoint_resources`, so each leg gets `num_gpus` and a custom resource that pins it to one
node. The price: the head runs the dashboard (`ray[default]`), which the tests' local cluster
(`ray.cluster_utils.Cluster(head_node_args={"include_dashboard": True})`) does.

`_run_job` takes PipesRayJobClient.run's steps (Pipes session, submission with the bootstrap
environment, `report_launched` for the log reader) with dagster-ray's own message reader, but its
own wait: PipesRayJobClient's wait polls with no deadline, and a job pending on a node that is
gone stays pending for Ray's 15-minute start timeout, even after `stop_job`.

Placement. Every node the runner may use advertises one custom resource of its own,
`<node_prefix><name>` (e.g. `ray start --resources '{"tica_node_h200a": 1}'`); a leg asks for a
sliver of it (`node_pin`), its GPUs limit how many run there at once. All the legs of one
evidence item -- one pairing: both arms, every crossed throughput round -- run on one node, in
the frozen order, one after another: a throughput comparison across nodes is confounded by the
node (tica.items.throughput.judge refuses it), and so is a quality pairing (the confounder table names
the node). Items go to nodes in turn (`item_nodes` pins one by name).

What a leg records. The runner puts the node in the leg's environment before the producer starts:
`TICA_NODE` (the node's name, the custom resource without its prefix), `TICA_NODE_ID` (Ray's
node id) and `TICA_NODE_IP`; every TICA producer records `TICA_*` and `CUDA_*` variables in
leg.json's `env` (tica.legs.common.recorded_env), so the node is in the sealed receipt. The job's
entrypoint is tica.legs.gpu_identity, which reads the GPU Ray gave it (`CUDA_VISIBLE_DEVICES`, its
UUID from nvidia-smi or `unknown`) into `<leg>.gpu.json` and `TICA_GPU_UUID`, then execs the
producer. After the job the runner checks that Ray ran it on that node (`driver_node_id`), and
writes beside the leg `<leg>.ray.json`: job id, node, GPU, status, Ray's message, times.

GPUs. A leg asks Ray for `num_gpus`; a throughput leg for at least one whole GPU, whatever
num_gpus says, so Ray never places another GPU leg on its device while it runs (a fraction would
let two legs share one). A leg asking for none is given no device (gpu_identity empties its
CUDA_VISIBLE_DEVICES). resources.ray_gpu_check reads the records back and names any throughput leg
that overlapped another leg on one GPU.

Receipts. Producers write under `shared_dir`, a folder every node sees (NFS, a PVC; here a local
folder): `<shared_dir>/<track>/<candidate>/<item>/<run>/<leg>`. The judges read them there.

A node that dies. Ray retries are off (a job's supervisor actor is never restarted): a node lost
mid-leg fails its job (`JOB_SUPERVISOR_ACTOR_DIED`, seconds later). A leg that sealed nothing is
recorded, not dropped: beside what the producer left, the runner seals `<leg>.failed/`, a leg.json
whose producer is this runner, whose `not_run_reason` starts `failed:` and whose `errors` hold what
Ray reported (node, job id, message). It holds no measurement, so it can never pass; the ledger
records it (status `not run`, the reason in its detail) and the judge names it. The legs of the
item not yet started on that node are sealed `<leg>.not-run/` (`not started: node ... lost`), never
moved to another node. A job still pending on a node that is gone, or past `leg_timeout_s`, is
stopped and recorded the same way: the runner never waits on a lost node.

Cost: dagster-ray's message reader tails the job's logs, and Ray closes a finished job's log tail
about 5 s after the job ends, so each leg costs ~5 s beyond its work (nothing next to a GPU leg;
most of the Ray tests' time).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import shlex
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagster import AssetExecutionContext, Failure, MetadataValue
from dagster_ray.core.pipes import PipesRayJobMessageReader, tail_logs
from pydantic import Field

from resources.dagster_compat import DagsterPipesExecutionError, extract_message_or_forward_to_stdout
from resources.legs import PROJECT_ROOT, LegRequest, LegRunner, LegSpec, leg_params, plan_legs, sealed_leg_dirs
from tica.evidence import EvidenceItem
from tica.receipts import write_leg_meta
from tica.seal import SEAL_FILE, seal_leg

RECORD_PRODUCER = "resources.ray_legs"
RECORD_VERSION = "1"
# The environment variables a leg is given to record its node (TICA_* are recorded by every producer).
NODE_ENV = ("TICA_NODE", "TICA_NODE_ID", "TICA_NODE_IP")
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
GPU_ENTRYPOINT = "tica.legs.gpu_identity"
THREAD_WAIT_TIMEOUT_S = 120.0  # dagster's THREAD_WAIT_TIMEOUT for a Pipes reader's thread
LOST_GRACE_S = 30.0  # how long a running job on a lost node may take to be failed by Ray


class _LegLogReader(PipesRayJobMessageReader):
    """dagster-ray's reader of Pipes messages from a Ray job's log tail, with two changes. A job that
    never started is not waited for (Ray's tail waits for it to run): the runner sets `abandon`. A
    job that ended is drained: its whole log is read once and the lines the tail has not handed on
    yet are handled, instead of waiting for Ray to close the tail (about 5 s after the job's end,
    measured with Ray 2.x here, per leg). Only whole lines are handled; a line cut between two
    chunks waits for its end."""

    abandon = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._drained = False
        self._consumed = 0  # characters of the log handled or held in _partial
        self._partial = ""

    def _take(self, handler, text: str) -> None:
        """Handle the whole lines of text (after what was held back); hold back a cut last line."""
        self._consumed += len(text)
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            if line:
                extract_message_or_forward_to_stdout(handler, line)

    def handle_job_logs(self, handler) -> None:
        try:
            while (self._job_id is None or self._client is None) and not self.session_closed.is_set():
                time.sleep(0.1)
            self.thread_ready.set()
            if self._job_id is None or self._client is None:
                return
            for chunk in tail_logs(self.client.tail_job_logs(job_id=self.job_id)):
                with self._lock:
                    if chunk and not self._drained:  # drained: read on to Ray's end of the tail, handing on nothing
                        self._take(handler, chunk)
        finally:
            with self._lock:
                if not self._drained and self._partial:
                    extract_message_or_forward_to_stdout(handler, self._partial)
                    self._partial = ""
            self.completed.set()

    def _drain(self, handler) -> bool:
        """The ended job's log read once, the lines not yet handled handled: whether it could be."""
        try:
            full = self.client.get_job_logs(self.job_id)
        except Exception:  # noqa: BLE001  (then the tail is waited for, as dagster-ray does)
            return False
        with self._lock:
            if self._drained or not isinstance(full, str) or len(full) < self._consumed:
                return False
            self._drained = True
            self._take(handler, full[self._consumed:])
            if self._partial:
                extract_message_or_forward_to_stdout(handler, self._partial)
                self._partial = ""
            return True

    def terminate(self, handler) -> None:
        self.session_closed.set()
        if self._thread is None:
            return
        if self.abandon:
            self._thread.join(timeout=1.0)  # a daemon thread: left to end with the job
            return
        if self.thread_ready.wait(timeout=THREAD_WAIT_TIMEOUT_S) and self._job_id is not None and self._drain(handler):
            return  # the tail thread, a daemon, ends when Ray closes it and hands on nothing more
        # as dagster's own readers wait for their thread (dagster._core.pipes.utils._join_thread)
        self._thread.join(timeout=THREAD_WAIT_TIMEOUT_S)
        if self._thread.is_alive():
            raise DagsterPipesExecutionError("Timed out waiting for ray job logs tailing thread to finish.")


@dataclass(frozen=True)
class RayNode:
    name: str  # the custom resource without its prefix
    resource: str
    node_id: str
    ip: str
    alive: bool

    def env(self) -> dict[str, str]:
        return dict(zip(NODE_ENV, (self.name, self.node_id, self.ip)))


@dataclass
class LegJob:
    """What became of one leg's Ray job."""

    spec: LegSpec
    out: Path
    node: RayNode
    submission_id: str
    status: str = "NOT_SUBMITTED"
    message: str | None = None
    error_type: str | None = None
    ran_on_node_id: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    stopped_because: str | None = None
    error: str | None = None
    legs: list[Path] = field(default_factory=list)
    recorded_failure: Path | None = None
    submitted_at: str | None = None  # by this runner's clock
    returned_at: str | None = None
    num_gpus: float | None = None  # what the job asked Ray for
    gpu: dict[str, Any] | None = None  # tica.legs.gpu_identity's record, read on the node; None: none written

    def record(self) -> dict[str, Any]:
        return {"item": self.spec.item.value, "leg": self.spec.name, "submission_id": self.submission_id, "status": self.status,
                "node": self.node.name, "node_id": self.node.node_id, "node_ip": self.node.ip,
                "ran_on_node_id": self.ran_on_node_id, "submitted_at": self.submitted_at, "started_at": self.started_at,
                "ended_at": self.ended_at, "returned_at": self.returned_at,
                "num_gpus": self.num_gpus, "gpu": self.gpu,
                "error_type": self.error_type, "message": self.message, "stopped_because": self.stopped_because,
                "error": self.error, "sealed_legs": [str(p) for p in self.legs],
                "failure_record": str(self.recorded_failure) if self.recorded_failure else None}


def _iso_ms(ms: int | None) -> str | None:
    return None if not ms else _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).isoformat()


class RayLegRunner(LegRunner):
    """Each leg's producer a Ray job (dagster-ray's PipesRayJobClient) on one pinned node."""

    address: str = Field(description="the Ray dashboard's HTTP address (http://head:8265): jobs and the node list")
    shared_dir: str = Field(description="a folder every node sees (or a file:// URL of one); legs seal their receipts under it")
    node_prefix: str = Field("tica_node_", description="custom resources naming the nodes the runner may use")
    item_nodes: dict[str, str] = Field(default_factory=dict, description="item -> node name: where that item's legs run")
    num_gpus: float = Field(1.0, ge=0, description="GPUs per leg (entrypoint_num_gpus)")
    num_cpus: float = Field(0.0, ge=0, description="CPUs per leg (entrypoint_num_cpus)")
    node_pin: float = Field(0.001, gt=0, le=1, description="how much of the node's own resource a leg asks for")
    python: str = Field("", description="the Python on the nodes; empty = this interpreter's path")
    project_root: str = Field("", description="TICA's checkout on the nodes (cwd and PYTHONPATH); empty = this one")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment for every leg (HF_HOME ...)")
    producer_module: str = Field("", description="module run in place of tica.legs.<item> ({item} is replaced; "
                                                 "words after the module are passed before the leg's flags)")
    item_args: dict[str, str] = Field(default_factory=dict, description="item -> producer flags added before the "
                                                                       "leg's own (engine sizing on a GPU node)")
    leg_timeout_s: float = Field(3600.0, gt=0, description="a leg's job past this (pending or running) is stopped")
    poll_interval_s: float = Field(0.5, gt=0, description="how often job status and node liveness are polled")

    # ------------------------------------------------------------------ the cluster
    def job_client(self):
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.address)

    def nodes(self) -> dict[str, RayNode]:
        """Every node advertising a `<node_prefix><name>` resource, alive or not, by name. A name
        advertised by two alive nodes pins nothing: refused."""
        from ray.util.state import list_nodes

        found: dict[str, RayNode] = {}
        for n in list_nodes(address=self.address, detail=True, limit=10_000, raise_on_missing_output=False):
            for res in (n.resources_total or {}):
                if not res.startswith(self.node_prefix):
                    continue
                node = RayNode(name=res[len(self.node_prefix):], resource=res, node_id=n.node_id, ip=n.node_ip,
                               alive=n.state == "ALIVE")
                other = found.get(node.name)
                if other is not None and other.alive and node.alive:
                    raise Failure(description=f"node resource {res} is advertised by two alive nodes "
                                              f"({other.node_id}, {node.node_id}): it cannot pin a leg")
                if other is None or node.alive:
                    found[node.name] = node
        return found

    def alive(self, node: RayNode) -> bool:
        now = self.nodes().get(node.name)
        return now is not None and now.alive and now.node_id == node.node_id

    def node_for(self, item: EvidenceItem) -> RayNode:
        nodes = self.nodes()
        live = sorted(name for name, n in nodes.items() if n.alive)
        if item.value in self.item_nodes:
            name = self.item_nodes[item.value]
            if name not in live:
                raise Failure(description=f"RayLegRunner.item_nodes: {item.value} -> {name}, but no alive node "
                                          f"advertises {self.node_prefix}{name} (alive: {', '.join(live) or 'none'})")
            return nodes[name]
        if not live:
            raise Failure(description=f"no alive Ray node at {self.address} advertises a {self.node_prefix}* resource")
        return nodes[live[list(EvidenceItem).index(item) % len(live)]]

    # ------------------------------------------------------------------ an evidence item
    def shared_root(self) -> Path:
        from upath import UPath

        root = UPath(self.shared_dir)
        if root.protocol not in ("", "file", "local"):
            raise Failure(description=f"RayLegRunner.shared_dir {self.shared_dir}: producers write with pathlib, so "
                                      "the shared folder must be mounted on every node (a path or file:// URL)")
        return Path(root.path)

    def leg_dir(self, request: LegRequest) -> Path:
        """request.out_dir (`<legs>/<track>/<candidate>/<item>/<run>`) re-rooted in the shared folder."""
        return self.shared_root().joinpath(*request.out_dir.parts[-4:])

    def run_legs(self, context: AssetExecutionContext, request: LegRequest) -> list[Path]:
        if request.item is EvidenceItem.ARTIFACTS:
            return []
        specs = plan_legs(request.item, request.question)
        node = self.node_for(request.item)
        root = self.leg_dir(request)
        root.mkdir(parents=True, exist_ok=True)
        context.log.info(f"{request.item.value}: {len(specs)} leg(s) on Ray node {node.name} ({node.node_id[:12]}, "
                         f"{node.ip}), receipts under {root}")
        jobs: list[LegJob] = []
        lost: str | None = None  # why the rest of the pairing does not run: its node is gone
        for spec in specs:
            job = LegJob(spec=spec, out=root / spec.name, node=node,
                         submission_id=f"tica-{context.run.run_id[:8]}-{request.item.value}-{spec.name}-"
                                       f"{uuid.uuid4().hex[:6]}")
            jobs.append(job)
            if lost is None and not self.alive(node):
                lost = f"node {node.name} ({node.node_id}) is no longer alive"
            if lost is not None:
                job.status = "NOT_STARTED"
                job.stopped_because = lost
                job.recorded_failure = self._write_record(
                    job, request, not_run_reason=f"not started: {lost}; a pairing's legs stay on one node")
                continue
            self._run_job(context, request, job)
            if job.recorded_failure is not None and not self.alive(node):
                lost = f"node {node.name} ({node.node_id}) was lost during leg {spec.name}"
        self._finish(context, request, jobs)
        return [p for j in jobs for p in (*j.legs, *(sealed_leg_dirs(j.recorded_failure) if j.recorded_failure else ()))]

    # ------------------------------------------------------------------ one leg
    def gpus_for(self, spec: LegSpec) -> float:
        """The GPUs a leg asks Ray for: a throughput leg at least one whole one (no other leg beside it)."""
        if spec.item is EvidenceItem.THROUGHPUT:
            return float(max(1, math.ceil(self.num_gpus)))
        return self.num_gpus

    def leg_command(self, spec: LegSpec, request: LegRequest, out: Path) -> tuple[list[str], dict[str, str]]:
        """The producer's argv and the environment the job adds (not this process's environment)."""
        from tica.legs.common import ALIGNED_ENV, ARM_ENV
        from tica.legs.runner import leg_command

        command, _ = leg_command(spec.item.value, spec.arm, out, **leg_params(spec, request))
        command[0] = self.python or sys.executable
        if self.producer_module:
            at = command.index("-m") + 1
            command[at:at + 1] = shlex.split(self.producer_module.format(item=spec.item.value))
        if spec.item.value in self.item_args:
            at = command.index("--out")
            command[at:at] = shlex.split(self.item_args[spec.item.value])
        root = self.project_root or str(PROJECT_ROOT)
        env = {**self.env, **ALIGNED_ENV, **ARM_ENV[spec.arm]}  # the arm's switch last: it wins
        env["PYTHONPATH"] = ":".join(x for x in (root, self.env.get("PYTHONPATH", "")) if x)
        return command, env

    def _run_job(self, context: AssetExecutionContext, request: LegRequest, job: LegJob) -> None:
        """PipesRayJobClient.run's steps -- a Pipes session whose context goes into the job's
        runtime_env, the job submitted, dagster-ray's PipesRayJobMessageReader tailing its logs --
        with a wait that ends: PipesRayJobClient's own wait polls with no deadline, and Ray keeps a
        job pending on a node that is gone (stop_job leaves a pending job pending) for its
        15-minute start timeout."""
        from dagster import PipesEnvContextInjector, open_pipes_session
        from dagster import DagsterExecutionInterruptedError
        from dagster_ray.core.pipes import PIPES_LAUNCHED_EXTRAS_RAY_ADDRESS_KEY, PIPES_LAUNCHED_EXTRAS_RAY_JOB_ID_KEY

        spec, node = job.spec, job.node
        job.out.parent.mkdir(parents=True, exist_ok=True)
        command, env = self.leg_command(spec, request, job.out)
        env.update(node.env())  # recorded by the producer in leg.json's env
        job.num_gpus = self.gpus_for(spec)
        env["TICA_LEG_GPUS"] = f"{job.num_gpus:g}"
        root = self.project_root or str(PROJECT_ROOT)
        wrapped = [command[0], "-m", GPU_ENTRYPOINT, "--record", str(self.gpu_record(job.out)), "--", *command]
        params: dict[str, Any] = {
            "entrypoint": f"cd {shlex.quote(root)} && {shlex.join(wrapped)}",
            "submission_id": job.submission_id,
            "entrypoint_resources": {node.resource: self.node_pin},
            "metadata": {"tica_item": spec.item.value, "tica_leg": spec.name, "tica_node": node.name,
                         "dagster_run_id": context.run.run_id},
        }
        if job.num_gpus:
            params["entrypoint_num_gpus"] = job.num_gpus
        if self.num_cpus:
            params["entrypoint_num_cpus"] = self.num_cpus
        context.log.info(f"leg {spec.item.value}/{spec.name}: Ray job {job.submission_id} on {node.name}: "
                         f"{' '.join(command[1:7])} ...")
        client = self.job_client()
        reader = _LegLogReader()
        job.submitted_at = _dt.datetime.now(_dt.timezone.utc).isoformat()
        try:
            with open_pipes_session(context=context, message_reader=reader,
                                    context_injector=PipesEnvContextInjector()) as session:
                params["runtime_env"] = {"env_vars": {**env, **session.get_bootstrap_env_vars()}}
                client.submit_job(**params)
                session.report_launched({"extras": {PIPES_LAUNCHED_EXTRAS_RAY_JOB_ID_KEY: job.submission_id,
                                                    PIPES_LAUNCHED_EXTRAS_RAY_ADDRESS_KEY: client.get_address()}})
                try:
                    status = self._wait(job, client)
                except DagsterExecutionInterruptedError:
                    context.log.warning(f"interrupted: stopping Ray job {job.submission_id}")
                    client.stop_job(job.submission_id)
                    raise
                if status in ("PENDING", "RUNNING"):
                    reader.abandon = True  # its log tail waits for a job that will not run here
        except DagsterExecutionInterruptedError:
            raise
        except Exception as err:  # noqa: BLE001  (a failed job is recorded below, never hidden)
            job.error = f"{type(err).__name__}: {str(err).strip()[:2000]}"
        finally:
            job.returned_at = _dt.datetime.now(_dt.timezone.utc).isoformat()
        self._job_info(job)
        job.gpu = self._gpu_record(job.out)
        sealed = sealed_leg_dirs(job.out)
        wanted = self._wanted_subs(spec, request)
        job.legs = sealed
        if job.status == "SUCCEEDED" and not job.error and sealed and not self._missing(sealed, wanted, job.out):
            self._check_node(context, job)
            return
        if sealed:  # a failed producer that sealed its receipt is evidence, kept as is
            context.log.warning(f"leg {spec.name}: Ray job {job.status}, but it sealed {len(sealed)} leg(s); kept")
        missing = self._missing(sealed, wanted, job.out)
        if missing or not sealed:
            job.recorded_failure = self._write_record(job, request, subs=missing)
            context.log.error(f"leg {spec.name} failed on node {node.name}: {job.status} "
                              f"{job.error_type or ''} {job.message or job.error or ''}; recorded in {job.recorded_failure}")

    def _wait(self, job: LegJob, client) -> str:
        """Poll the job to its end. One that cannot end by itself -- pending or running on a node
        that is gone, or past leg_timeout_s -- is stopped; a pending one is not waited on further."""
        started = time.monotonic()
        lost_since: float | None = None
        while True:
            status = str(client.get_job_status(job.submission_id).value)
            if status in TERMINAL:
                return status
            why = None
            if time.monotonic() - started > self.leg_timeout_s:
                why = f"past leg_timeout_s {self.leg_timeout_s:g} s ({status})"
            elif not self.alive(job.node):
                lost_since = lost_since or time.monotonic()
                # Ray fails a running job whose node died within seconds; pending, it would wait.
                if status == "PENDING" or time.monotonic() - lost_since > LOST_GRACE_S:
                    why = f"{status.lower()} on node {job.node.name} ({job.node.node_id}), which is no longer alive"
            if why:
                job.stopped_because = why
                try:
                    client.stop_job(job.submission_id)
                except Exception:  # noqa: BLE001
                    pass
                deadline = time.monotonic() + (LOST_GRACE_S if status == "RUNNING" else 0)
                while time.monotonic() < deadline:
                    status = str(client.get_job_status(job.submission_id).value)
                    if status in TERMINAL:
                        break
                    time.sleep(self.poll_interval_s)
                return status
            time.sleep(self.poll_interval_s)

    @staticmethod
    def gpu_record(out: Path) -> Path:
        return out.with_name(out.name + ".gpu.json")

    def _gpu_record(self, out: Path) -> dict[str, Any] | None:
        try:
            return json.loads(self.gpu_record(out).read_text())
        except (OSError, ValueError):
            return None

    def _wanted_subs(self, spec: LegSpec, request: LegRequest) -> list[int] | None:
        """Throughput: the concurrencies a leg seals one sub-leg each for (`c<N>/`)."""
        if spec.item is EvidenceItem.THROUGHPUT:
            return list(getattr(request.question.criteria, "concurrencies", []) or [])
        return None

    @staticmethod
    def _missing(sealed: list[Path], wanted: list[int] | None, out: Path) -> list[int]:
        if wanted is None:
            return []
        return [c for c in wanted if out / f"c{c}" not in sealed]

    def _job_info(self, job: LegJob) -> None:
        try:
            info = self.job_client().get_job_info(job.submission_id)
        except Exception as err:  # noqa: BLE001
            job.status = "UNKNOWN"
            job.message = f"job info unavailable: {err}"
            return
        job.status = str(info.status.value)
        job.message = info.message
        job.error_type = getattr(info, "error_type", None)
        job.ran_on_node_id = getattr(info, "driver_node_id", None) or None
        job.started_at, job.ended_at = _iso_ms(info.start_time), _iso_ms(info.end_time)

    def _check_node(self, context: AssetExecutionContext, job: LegJob) -> None:
        if job.ran_on_node_id and job.ran_on_node_id != job.node.node_id:
            raise Failure(description=f"leg {job.spec.name}: pinned to node {job.node.name} ({job.node.node_id}) but "
                                      f"Ray ran it on {job.ran_on_node_id}: its receipt names the wrong node")

    # ------------------------------------------------------------------ records
    def _write_record(self, job: LegJob, request: LegRequest, subs: list[int] | None = None,
                      not_run_reason: str | None = None) -> Path:
        """A sealed leg recording what became of a leg that sealed nothing: `errors` (it ran and
        was lost) or `not_run_reason` (it never started). Beside the producer's folder, which is
        left as the producer left it. Throughput: one per concurrency it did not seal."""
        spec = job.spec
        base = job.out.with_name(job.out.name + (".failed" if not_run_reason is None else ".not-run"))
        targets = [(base / f"c{c}", c) for c in subs] if subs else [(base, None)]
        if spec.item is EvidenceItem.THROUGHPUT and not subs:
            targets = [(base / f"c{c}", c) for c in (self._wanted_subs(spec, request) or [])] or targets
        from tica.legs.common import ARM_ENV

        what = (f"Ray job {job.submission_id} on node {job.node.name} (id {job.node.node_id}, {job.node.ip}) "
                f"ended {job.status}" + (f" [{job.error_type}]" if job.error_type else "")
                + (f": {job.message}" if job.message else "") + (f"; stopped: {job.stopped_because}" if job.stopped_because else "")
                + (f"; client: {job.error}" if job.error and not job.message else ""))
        for path, conc in targets:
            path.mkdir(parents=True, exist_ok=True)
            if (path / SEAL_FILE).exists():
                continue
            meta = {
                "schema": "tica.leg/1", "item": spec.item.value, "arm": spec.arm, "round": spec.round,
                "slot": spec.slot, "concurrency": conc, "producer": RECORD_PRODUCER,
                "producer_version": RECORD_VERSION,
                "env": {**ARM_ENV[spec.arm], **job.node.env(),
                        **({"CUDA_VISIBLE_DEVICES": job.gpu["cuda_visible_devices"], "TICA_GPU_UUID": job.gpu["uuid"]}
                           if job.gpu and job.gpu.get("uuid") else {})},
                "resolved_config": {"ray_job": job.submission_id, "producer_dir": str(job.out)},
                "started_at": job.started_at, "ended_at": job.ended_at,
                "processes": [], "not_run_reason": not_run_reason,
            }
            if not_run_reason is None:  # it ran and was lost: not run to its end, and incomplete
                meta["not_run_reason"] = f"failed: {what}; the producer sealed no receipt"
                meta["errors"] = [f"{what}; the producer sealed no receipt here, so this leg.json is {RECORD_PRODUCER}'s "
                                  "record of the failure, not a measurement"]
            write_leg_meta(path, meta)
            seal_leg(path)
        return base

    def _finish(self, context: AssetExecutionContext, request: LegRequest, jobs: list[LegJob]) -> None:
        for job in jobs:
            if job.out.parent.is_dir():
                (job.out.parent / f"{job.spec.name}.ray.json").write_text(json.dumps(job.record(), indent=1))
        failed = [j for j in jobs if j.recorded_failure is not None]
        nodes = sorted({j.node.name for j in jobs})
        context.add_asset_metadata({
            "ray_nodes": MetadataValue.text(", ".join(nodes)),
            "ray_jobs": MetadataValue.json([j.record() for j in jobs]),
            "ray_failed_legs": MetadataValue.json([j.spec.name for j in failed]),
        })
        for j in failed:
            context.log.warning(f"{request.item.value}/{j.spec.name}: recorded as "
                                f"{'not run' if j.status == 'NOT_STARTED' else 'failed'} in {j.recorded_failure}")
