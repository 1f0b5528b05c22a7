"""The two-GPU Ray track's command (scripts/h200/ray_track.py) in its CPU dry run: its own code
path (materialize with TICA_LEG_RUNNER=ray, then its checks) on the session's Ray cluster, whose
worker nodes each count one fake GPU of their own index, with the stand-in producer
(tests/ray/fake_producer.py) and the ledger on Postgres.

Shown: every leg lands in the ledger; each receipt names its node and GPU (the GPU's UUID `unknown`
where no nvidia-smi answers, never made up); no throughput leg overlapped another on one GPU, even
when another item's legs wait on that node for it (TICA_TESTS=full); and the same check catches a
runner that lets them share (the negative control). The default runs a short slice (one throughput
round, and the control); TICA_TESTS=full runs the whole track, the runner under contention, and the
whole script with its own cluster and Postgres."""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from resources.ray_gpu_check import check, records
from resources.ray_legs import RayLegRunner
from tests.long import FULL, SKIP_REASON
from tests.ray.ray_project import TRACK, leg_json, ray_project
from tica.evidence import EvidenceItem

# serial beside the node-loss and writers tests, whose cluster (tests/ray/conftest.py) it shares: in the
# two-worker phase it met tests/ray/test_ray_legs.py's cluster on the other worker, and two clusters on one
# host at once lost its jobs (404: the job does not exist)
pytestmark = [pytest.mark.scale, pytest.mark.serial]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "h200" / "ray_track.py"
PRODUCER = "tests.ray.fake_producer --item {item}"


def _script():
    spec = importlib.util.spec_from_file_location("ray_track", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _one_round(project) -> None:
    """The throughput question cut to one crossed round (two legs), for the default's slice."""
    path = project.settings.questions_dir / "throughput.yaml"
    q = yaml.safe_load(path.read_text())
    q.update(repeats=1, pairing_order=["AB"])
    q["criteria"].pop("statistical_basis", None)
    path.write_text(yaml.safe_dump(q, sort_keys=False))


def _run(rt, project, work: Path, items: tuple[str, ...], nodes: dict[str, str] | None = None, **env):
    return rt.TrackRun(track=TRACK, candidates_dir=project.settings.candidates_dir,
                       questions_dir=project.settings.questions_dir, work=work, items=items,
                       producer_module=PRODUCER, leg_env={"TICA_FAKE_PROJECT": str(project.root), **env},
                       item_nodes=nodes or {}, leg_timeout_s=120)


class SharingRunner(RayLegRunner):
    """The negative control: a runner that lets a throughput leg take a fraction of a GPU."""

    def gpus_for(self, spec) -> float:
        return self.num_gpus


def _pair_on(rt, project, tmp: Path, address: str, node: str, runner_cls) -> dict[str, tuple]:
    """Throughput and forward as two Dagster runs at once on one node, each leg asking half a GPU;
    the throughput leg of arm bi1 works 5 s, so forward's legs come while it runs: (run, runner) by item."""
    pair = {}
    for item in ("throughput", "forward"):
        run = _run(rt, project, tmp / item, (item,), {item: node}, TICA_FAKE_SLEEP="throughput:bi1:5")
        pair[item] = (run, runner_cls(address=address, shared_dir=str(run.shared), producer_module=PRODUCER,
                                      env=run.leg_env, num_gpus=0.5, item_nodes=run.item_nodes,
                                      poll_interval_s=0.25, leg_timeout_s=120))
    return pair


def _materialize_and_exit(rt, address: str, dsn: str, run, runner) -> None:
    os._exit(0 if rt.materialize(run, address, dsn, runner=runner) else 1)


def _at_once(rt, address: str, dsn: str, runs: dict[str, tuple]) -> None:
    """Each (run, runner) materialized in a forked process of its own, throughput's first (half a
    second's lead): Dagster's in-process execution deadlocks on its log handlers in two threads."""
    fork = multiprocessing.get_context("fork")
    procs = {name: fork.Process(target=_materialize_and_exit, args=(rt, address, dsn, *runs[name])) for name in runs}
    for name in sorted(runs, key=lambda n: "forward" in n):
        procs[name].start()
        time.sleep(0.5 if "throughput" in name else 0)
    for p in procs.values():
        p.join(timeout=300)
    codes = {name: p.exitcode for name, p in procs.items()}
    for p in procs.values():
        if p.exitcode is None:
            p.kill()
    assert codes == {name: 0 for name in runs}, codes


def test_the_dry_run_passes_its_checks_and_a_runner_that_shares_a_gpu_is_caught(ray_cluster, pg_dsn, tmp_path):
    rt = _script()
    project, _ = ray_project(tmp_path / "project", pg_dsn)
    if not FULL:
        _one_round(project)
    # the script's own run (its runner, rt.runner_for) on w1 and, beside it on w2, the negative control
    kept = _run(rt, project, tmp_path / "work", () if FULL else ("throughput",), None if FULL else {"throughput": "w1"})
    control = _pair_on(rt, project, tmp_path / "control", ray_cluster.dashboard, "w2", SharingRunner)
    t0 = time.monotonic()
    _at_once(rt, ray_cluster.dashboard, pg_dsn,
             {"kept": (kept, rt.runner_for(kept, ray_cluster.dashboard)),
              **{f"control-{item}": pair for item, pair in control.items()}})
    summary = rt.verify(kept, pg_dsn)
    print(f"the dry run and its control: {time.monotonic() - t0:.1f} s, {len(summary['ray_jobs'])} + 4 Ray jobs")

    assert summary["ok"], {k: summary[k] for k in ("checks", "not_in_ledger", "receipt_problems", "gpu_overlaps",
                                                   "gpu_unknown", "wrong_node")}
    recs = summary["ray_jobs"]
    assert {r["item"] for r in recs} == ({i.value for i in EvidenceItem} - {"artifacts"} if FULL else {"throughput"})
    assert all(r["status"] == "SUCCEEDED" for r in recs)
    assert all(r["num_gpus"] >= 1 for r in recs if r["item"] == "throughput")
    nodes_index = {name: str(i) for i, name in enumerate(ray_cluster.nodes)}  # each node's fake GPU index
    no_smi = shutil.which("nvidia-smi") is None
    for r in recs:
        assert r["gpu"]["cuda_visible_devices"] == nodes_index[r["node"]]
        for leg in r["sealed_legs"]:
            env = leg_json(leg)["env"]
            assert env["TICA_NODE"] == r["node"] and env["TICA_NODE_ID"] == r["node_id"]
            assert env["CUDA_VISIBLE_DEVICES"] == nodes_index[r["node"]]
            assert env["TICA_GPU_UUID"] == ("unknown" if no_smi else r["gpu"]["uuid"])

    # The control: throughput on half a GPU too, and the same check names the overlap.
    shared = check([r for run, _ in control.values() for r in records(run.shared)])
    assert not shared.ok and shared.overlaps, shared
    assert any(o.startswith("throughput leg throughput/bi1") and "with forward/" in o for o in shared.overlaps), \
        shared.overlaps


@pytest.mark.long
@pytest.mark.skipif(not FULL, reason=SKIP_REASON)
def test_the_runner_holds_other_legs_back_while_a_throughput_leg_holds_the_gpu(ray_cluster, pg_dsn, tmp_path):
    rt = _script()
    project, _ = ray_project(tmp_path / "project", pg_dsn)
    _one_round(project)
    pair = _pair_on(rt, project, tmp_path / "kept", ray_cluster.dashboard, "w1", RayLegRunner)
    _at_once(rt, ray_cluster.dashboard, pg_dsn, pair)
    # throughput asks a whole GPU, so Ray holds forward's half-GPU legs back until it ends
    kept = check([r for run, _ in pair.values() for r in records(run.shared)])
    assert kept.ok and {s.item for s in kept.spans} == {"throughput", "forward"}, kept


@pytest.mark.long
@pytest.mark.skipif(not FULL, reason=SKIP_REASON)
def test_the_whole_script_starts_its_cluster_and_postgres_and_stops_them(tmp_path):
    if not Path("/usr/lib/postgresql/15/bin/initdb").exists():
        pytest.skip("no Postgres server binaries (scripts/setup.sh installs Debian's postgresql)")
    project, _ = ray_project(tmp_path / "project", "postgresql://unused")
    out = tmp_path / "out"
    work = Path(tempfile.mkdtemp(prefix="tica-ray-track-"))  # not under pytest's folder: private to root
    work.chmod(0o755)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--fake-gpus", "--gpus", "0,1", "--track", TRACK,
                           "--candidates-dir", str(project.settings.candidates_dir),
                           "--questions-dir", str(project.settings.questions_dir), "--work", str(work),
                           "--producer-module", PRODUCER, "--leg-env", f"TICA_FAKE_PROJECT={project.root}",
                           "--out", str(out)], capture_output=True, text=True, timeout=900, cwd=str(REPO))
    shutil.rmtree(work, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and summary["dagster_success"] and (out / "receipts.tgz").is_file()
    assert set(summary["nodes"]) == {"gpu0", "gpu1"}
    assert {r["node"] for r in summary["ray_jobs"]} == {"gpu0", "gpu1"}
