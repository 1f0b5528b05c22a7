"""A node lost mid-leg (issue 15): the leg's Ray job fails (retries off), the runner records the
leg as failed -- sealed, naming the node and what Ray reported, so its verdict cannot pass and the
ledger holds it -- without hanging; the pairing's next leg, due on that node, is recorded not
started (never moved to another node); the run's other legs are intact. The node's death is
`cluster.remove_node` plus a SIGKILL of the leg's process: on one host the job's entrypoint
would outlive its raylet, as it could not outlive a machine."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.dagster.dagster_helpers import kept_instance, materialize_track, tick
from tests.ray.ray_project import TRACK, leg_json, ray_defs, ray_project, ray_runner
from tica.evidence import EvidenceItem
from tica.ledger import PostgresLedger
from tica_assets.keys import evidence_key

pytestmark = [pytest.mark.scale, pytest.mark.serial]  # they time the runner's reaction to a lost node (< 10 s, < 20 s)

SLEEP_S = 120  # the victim leg's work: the test must end well before it would


def _kill_when_working(cluster, node, shared: Path, seen: dict) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        pids = list(shared.rglob("forward/*/bi1-s1.pid"))
        if pids:
            time.sleep(1.0)  # mid-leg: the producer is at work
            seen["pid"] = int(pids[0].read_text())
            seen["at"] = time.monotonic()
            cluster.remove_node(node)
            try:
                os.kill(seen["pid"], signal.SIGKILL)  # what the machine's death does to it
            except ProcessLookupError:
                pass
            return
        time.sleep(0.2)


def test_a_node_lost_mid_leg_leaves_that_leg_failed_and_recorded_and_the_rest_intact(ray_cluster, pg_dsn, tmp_path):
    victim = ray_cluster.add_worker("victim")
    project, settings = ray_project(tmp_path / "project", pg_dsn)
    shared = tmp_path / "shared"
    runner = ray_runner(project, ray_cluster.dashboard, shared, item_nodes={"forward": "victim", "quality": "w1"},
                        env={"TICA_FAKE_SLEEP": f"forward:bi1:{SLEEP_S}"})
    defs = ray_defs(settings, runner)
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)
    seen: dict = {}
    killer = threading.Thread(target=_kill_when_working, args=(ray_cluster.cluster, victim, shared, seen), daemon=True)
    killer.start()
    t0 = time.monotonic()
    materialize_track(defs, instance, TRACK, keys=[evidence_key(TRACK, EvidenceItem.FORWARD),
                                                  evidence_key(TRACK, EvidenceItem.QUALITY)])
    took = time.monotonic() - t0
    killer.join(5)
    assert "pid" in seen, "the victim leg never started"
    print(f"run: {took:.1f} s; ended {time.monotonic() - seen['at']:.1f} s after the node was lost")
    assert took < SLEEP_S  # the runner did not wait for the lost leg

    ledger = PostgresLedger(pg_dsn)
    assert ledger.verify().ok
    legs = {(r["item"], r["arm"]): r for r in ledger.rows("SELECT item, arm, status, leg_dir FROM legs")}
    # The lost leg (forward's first, BI=1): recorded failed, sealed by the runner, naming the node and
    # Ray's reason; the pairing's other leg, due on the same node, recorded not started (never moved).
    lost = legs[("forward", "bi1")]
    meta = leg_json(lost["leg_dir"])
    assert lost["status"] == "not run" and meta["producer"] == "resources.ray_legs"
    assert meta["not_run_reason"].startswith("failed: Ray job ") and "on node victim" in meta["not_run_reason"]
    assert meta["env"]["TICA_NODE"] == "victim" and meta["env"]["VLLM_BATCH_INVARIANT"] == "1"
    assert "victim" in meta["errors"][0] and "FAILED" in meta["errors"][0] and "not a measurement" in meta["errors"][0]
    detail = ledger.rows("SELECT detail_json FROM legs WHERE item = 'forward' AND arm = 'bi1'")[0]["detail_json"]
    assert "on node victim" in detail
    after = leg_json(legs[("forward", "bi0")]["leg_dir"])
    assert after["not_run_reason"].startswith("not started: node victim") and "errors" not in after
    forward = ledger.rows("SELECT verdict, summary FROM verdicts WHERE item = 'forward'")[-1]
    print(f"forward: {forward['verdict']}: {forward['summary']}")
    assert forward["verdict"] == "not run"
    records = {p.name: json.loads(p.read_text()) for p in shared.rglob("forward/*/*.ray.json")}
    assert records["bi1-s1.ray.json"]["status"] == "FAILED" and records["bi0-s2.ray.json"]["status"] == "NOT_STARTED"
    # The rest intact: quality on another node, in the same run.
    verdicts = {r["item"]: r for r in ledger.rows("SELECT item, verdict, summary FROM track_verdicts")}
    assert verdicts["quality"]["verdict"] == "pass", verdicts["quality"]
    assert {leg_json(legs[("quality", a)]["leg_dir"])["env"]["TICA_NODE"] for a in ("bi1", "bi0")} == {"w1"}
    assert all(legs[("quality", a)]["status"] == "sealed" for a in ("bi1", "bi0"))


def test_a_job_pending_on_a_node_that_is_gone_is_stopped_not_waited_on(ray_cluster, tmp_path):
    """Ray keeps a job whose node resource no alive node offers pending (for its 15-minute start
    timeout, even after stop_job); the runner's wait stops it and returns as soon as it sees the
    node gone, and the leg is then recorded failed (the test above)."""
    from ray.job_submission import JobSubmissionClient

    from resources.legs import LegSpec
    from resources.ray_legs import LegJob, RayLegRunner, RayNode

    runner = RayLegRunner(address=ray_cluster.dashboard, shared_dir=str(tmp_path), poll_interval_s=0.25)
    gone = RayNode(name="gone", resource="tica_node_gone", node_id="0" * 56, ip="192.0.2.9", alive=False)
    job = LegJob(spec=LegSpec(EvidenceItem.FORWARD, "bi1", slot=1), out=tmp_path / "bi1-s1", node=gone,
                 submission_id=f"tica-test-pending-{time.time_ns()}")
    client = JobSubmissionClient(ray_cluster.dashboard)
    client.submit_job(entrypoint="true", submission_id=job.submission_id, entrypoint_resources={gone.resource: 0.001})
    t0 = time.monotonic()
    status = runner._wait(job, client)
    assert time.monotonic() - t0 < 10
    assert status == "PENDING" and "pending on node gone" in job.stopped_because


def test_a_leg_whose_node_is_gone_before_it_starts_is_recorded_failed_within_seconds(ray_cluster, tmp_path):
    """The same through the runner's whole leg path (Pipes session, submission, log reader): the
    job stays pending, the wait stops it, the reader does not wait for its log tail, and the leg
    is sealed failed, naming the node."""
    from types import SimpleNamespace

    from dagster import MaterializeResult, asset, materialize

    from resources.legs import LegSpec
    from resources.ray_legs import LegJob, RayLegRunner, RayNode

    runner = RayLegRunner(address=ray_cluster.dashboard, shared_dir=str(tmp_path), poll_interval_s=0.25,
                          producer_module="tests.ray.fake_producer --item {item}")
    gone = RayNode(name="gone", resource="tica_node_gone", node_id="0" * 56, ip="192.0.2.9", alive=False)
    spec = LegSpec(EvidenceItem.CLEAN_EXIT, "bi1", slot=1)
    job = LegJob(spec=spec, out=tmp_path / "legs" / "bi1-s1", node=gone, submission_id=f"tica-test-gone-{time.time_ns()}")
    manifest = SimpleNamespace(checkpoint_path=tmp_path, manifest=SimpleNamespace(
        runner=SimpleNamespace(trainer="vllm_kernels"), recipe=SimpleNamespace(shutdown_timeout=None)))
    request = SimpleNamespace(item=EvidenceItem.CLEAN_EXIT, manifest=manifest, question=SimpleNamespace(criteria=None))

    @asset
    def one_leg(context):
        runner._run_job(context, request, job)
        return MaterializeResult()

    t0 = time.monotonic()
    assert materialize([one_leg]).success
    assert time.monotonic() - t0 < 20
    assert job.legs == [] and job.recorded_failure is not None
    meta = leg_json(job.recorded_failure)
    assert meta["not_run_reason"].startswith("failed: Ray job ") and "ended PENDING" in meta["not_run_reason"]
    assert "stopped: pending on node gone" in meta["not_run_reason"] and meta["env"]["TICA_NODE"] == "gone"
