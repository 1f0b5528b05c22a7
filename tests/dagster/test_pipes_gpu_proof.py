"""The device proof script (scripts/h200/pipes_gpu_proof.py) in its CPU dry run: one Dagster run
of two leg assets under the multiprocess executor, every producer command a Pipes child on its
own lease from a pool of pretend devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SCRIPT = REPO / "scripts" / "h200" / "pipes_gpu_proof.py"


def run_proof(tmp_path: Path, *args: str, fake: bool = True, timeout: int = 300,
              pause_s: str = "2") -> tuple[int, dict, str]:
    env = dict(os.environ, TICA_FAKE_PRODUCER_S=pause_s,
                PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    env.pop("DAGSTER_HOME", None)
    extra = ["--producer-module", "dagster_fake_h200_producer"] if fake else []
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path / "out"),
                           "--work", str(tmp_path / "work"), *extra, *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    summary_path = tmp_path / "out" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    return proc.returncode, summary, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_two_gpus_two_legs_at_once_each_on_its_own_device(tmp_path):
    code, summary, output = run_proof(tmp_path)
    assert code == 0, output
    checks = summary["checks"]
    assert checks["two_bi1_legs_at_once_on_different_devices"] is True
    assert checks["no_device_held_by_two_leases_at_once"] is True
    assert checks["pipes_log_lines_arrived_from_every_asset"] is True
    assert {c["name"] for c in summary["children"].values()} == {"make-model", "bi1", "bi0"}
    assert summary["same_device_overlaps"] == []
    assert summary["materializations"]["forward"]["gpu_leases"]
    with tarfile.open(tmp_path / "out" / "legs.tgz") as tf:
        names = tf.getnames()
    assert "forward/bi1/gpu_lease.json" in names and "update/bi1/legs/update_bi1/seal.json" in names
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"summary.json", "events.jsonl", "legs.tgz", "logs.tgz"}


def test_one_gpu_the_legs_take_turns(tmp_path):
    code, summary, output = run_proof(tmp_path, "--pretend-devices", "1")
    assert code == 0, output
    assert summary["checks"]["a_leg_waited_its_turn"] is True
    assert summary["checks"]["two_bi1_legs_at_once_on_different_devices"] is None
    assert summary["concurrent_on_different_devices"] == [] and summary["same_device_overlaps"] == []


@pytest.mark.serial  # a 15 s deadline
def test_past_its_deadline_the_proof_still_writes_what_it_has(tmp_path):
    """A device call has a hard limit: the proof reports before it, never nothing."""
    t0 = time.time()
    code, summary, output = run_proof(tmp_path, "--deadline", "15", pause_s="120")
    assert code == 2, output
    assert time.time() - t0 < 60
    assert summary["timed_out"] and summary["ok"] is False
    assert any("bi1" in holder for holder in summary["held_at_deadline"].values())
    assert summary["leases"] and all(x["released_at"] is None or x["held_s"] is not None for x in summary["leases"])
    assert (tmp_path / "out" / "legs.tgz").is_file()


@pytest.mark.slow
@pytest.mark.long  # ~2.5 min; its short slices: the proof above with the fake producer (the pool, the
# leases, Pipes) and tests/legs/test_pipes_child.py (a real producer's dry run through the Pipes child)
def test_the_proof_runs_the_real_producers_dry(tmp_path):
    """The producers' own CPU dry run (tiny model, torch reference kernels, fake rollout): about
    two and a half minutes on two cores, two bi1 processes at once."""
    code, summary, output = run_proof(tmp_path, "--steps", "1", fake=False, timeout=600)
    assert code == 0, output
    assert summary["checks"]["every_leg_sealed"] and summary["checks"]["every_child_exited_0"]
    assert all(step["n_bitwise_diff"] == 0 for step in summary["bitwise"]["forward/bi1/forward_bi1_decode"])


# ---------------------------------------------------------------- the run on two H200s
GPU_PROOF = REPO / "tests" / "fixtures" / "h200" / "calls" / "pipes"


def _gpu_leases():
    from tica.gpu_pool import GpuLease

    return {p.parent.relative_to(GPU_PROOF / "steps").as_posix(): GpuLease.model_validate_json(p.read_text())
            for p in sorted((GPU_PROOF / "steps").glob("*/*/gpu_lease.json"))}


def test_on_two_h200s_the_pool_gave_concurrent_legs_different_devices():
    """Recomputed from the lease records that came back from nvidia-h200-x2 (session 2, call 8),
    not from the script's own verdict: forward's and update's bi1 legs ran at the same time
    through Dagster Pipes, each on its own GPU, and no device was ever held twice."""
    from tica.gpu_pool import overlapping_leases

    leases = _gpu_leases()
    assert set(leases) == {"forward/make-model", "forward/bi1", "forward/bi0", "update/make-model", "update/bi1"}
    assert all(d.name == "NVIDIA H200" for lease in leases.values() for d in lease.devices)
    assert overlapping_leases(list(leases.values())) == []
    f, u = leases["forward/bi1"], leases["update/bi1"]
    assert set(f.indices) | set(u.indices) == {0, 1} and not set(f.indices) & set(u.indices)
    start = max(f.acquired_at, u.acquired_at)
    end = min(f.released_at, u.released_at)
    assert start < end  # held at once
    summary = json.loads((GPU_PROOF / "summary.json").read_text())
    assert summary["ok"] is True and summary["dry_run"] is False
    children = summary["children"]
    assert set(children) == set(leases) and all(c["rc"] == 0 for c in children.values())
    # each child's CUDA saw exactly the GPU its lease named
    for step, child in children.items():
        assert [d["uuid"] for d in child["device_check"]["seen"]] == [d.uuid.removeprefix("GPU-")
                                                                      for d in leases[step].devices]
    assert all(n > 0 for n in summary["pipes_log_lines"]["by_step"].values())


def test_the_overlap_detector_sees_a_device_held_twice():
    """The negative control of the check above: the same records with update's bi1 moved onto
    forward's GPU overlap."""
    from tica.gpu_pool import overlapping_leases

    leases = _gpu_leases()
    moved = leases["update/bi1"].model_copy(update={"devices": leases["forward/bi1"].devices})
    assert overlapping_leases([leases["forward/bi1"], moved])
