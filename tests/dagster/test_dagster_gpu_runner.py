"""The local GPU leg runner: each producer command a Dagster Pipes child on devices leased from
one GPU pool. Fast tests stand a small fake in for the producers (same commands, legs written
through the producers' legio); the slow one runs the real producers' CPU dry run."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from dagster import DagsterEventType, DagsterInstance, execute_job, reconstructable
from dagster_gpu_job import ENV, gpu_job
from dagster_helpers import build_defs, kept_instance, tick
from dagster_project import TRACK

from resources import LocalGpuLegRunner
from tica.evidence import EvidenceItem
from tica.gpu_pool import GpuLease, overlapping_leases
from tica.seal import check_seal
from tica_assets.keys import evidence_key

HERE = Path(__file__).resolve().parent
FAKE = "dagster_fake_h200_producer"
FORWARD_LEGS = ["forward_bi1_decode", "forward_bi1_decode_post_update", "forward_bi0_hf"]


@pytest.fixture
def fake_producers(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))


def materialize_item(project, tmp_path, runner: LocalGpuLegRunner, item: EvidenceItem):
    settings = dataclasses.replace(project.settings, replay={})
    defs = build_defs(settings, resources={"leg_runner": runner})
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)
    result = defs.resolve_job_def(f"{TRACK}_evidence").execute_in_process(
        instance=instance, raise_on_error=False, asset_selection=[evidence_key(TRACK, item)])
    return instance, result


def pipes_lines(instance: DagsterInstance, run_id: str) -> list[str]:
    return [e.user_message for e in instance.all_logs(run_id) if e.user_message.startswith("pipes[")]


def forward_metadata(instance: DagsterInstance) -> dict:
    event = instance.get_latest_materialization_event(evidence_key(TRACK, EvidenceItem.FORWARD))
    return event.asset_materialization.metadata


def leases_of(root: Path) -> list[GpuLease]:
    return [GpuLease.model_validate_json(p.read_text()) for p in sorted(root.rglob("gpu_lease.json"))]


def test_forward_legs_run_through_pipes_on_the_leased_gpu(project, tmp_path, fake_producers):
    runner = LocalGpuLegRunner(devices=[3], lock_dir=str(tmp_path / "locks"), producer_module=FAKE, dry_run=True,
                               bi0_megatron=True)
    instance, result = materialize_item(project, tmp_path, runner, EvidenceItem.FORWARD)
    assert result.success
    # the child's progress lines, through Pipes, in the run's event log
    lines = pipes_lines(instance, result.run_id)
    assert any(line.startswith("pipes[bi1]: [tica") and "bi1 starts on CUDA_VISIBLE_DEVICES=3" in line
               for line in lines)
    assert any(line.startswith("pipes[bi0]: CUDA_VISIBLE_DEVICES=3 VLLM_BATCH_INVARIANT=0") for line in lines)
    meta = forward_metadata(instance)
    assert meta["leg_runner"].value == "LocalGpuLegRunner"
    assert meta["gpu_devices"].value == "3"
    runs = {r["name"]: r for r in meta["gpu_leases"].value}
    assert list(runs) == ["bi1", "bi0", "bi0-megatron"]
    assert all(r["lease"]["devices"] == [3] and r["rc"] == 0 for r in runs.values())
    assert [r["vllm_batch_invariant"] for r in runs.values()] == ["1", "0", "0"]
    legs = [Path(p) for p in meta["leg_dirs"].value]
    assert [p.name for p in legs] == [*FORWARD_LEGS, "forward_bi0_megatron"]
    for leg in legs:
        leg_json = json.loads((leg / "leg.json").read_text())
        # what the child's process saw, sealed into its receipt
        assert leg_json["env"]["CUDA_VISIBLE_DEVICES"] == "3"
        assert leg_json["env"]["VLLM_BATCH_INVARIANT"] == ("1" if leg.name.startswith("forward_bi1") else "0")
        # megatron-core's process starts no vLLM engine: no engine_core record of its own
        want = ["trainer"]  # the engine core ran inside the producer: no record of its own (issue 10)
        assert [p["role"] for p in leg_json["processes"]] == want
        assert leg_json["processes"][0]["exit_code"] == 0
        assert check_seal(leg) == []
        lease = GpuLease.model_validate_json((leg.parent.parent / "gpu_lease.json").read_text())
        assert lease.cuda_visible_devices == "3" and lease.released_at is not None


def run_two_legs(tmp_path, project, devices: list[int], monkeypatch):
    runner = {"devices": devices, "lock_dir": str(tmp_path / "locks"), "producer_module": FAKE, "dry_run": True,
              "share_within_run": False}
    monkeypatch.setenv(ENV, json.dumps({"root": str(project.root), "runner": runner}))
    monkeypatch.setenv("TICA_FAKE_PRODUCER_S", "3")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    home = tmp_path / "dagster_home_mp"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    with DagsterInstance.from_config(str(home)) as instance:
        with execute_job(reconstructable(gpu_job), instance=instance) as result:
            assert result.success
            started = [e for e in instance.all_logs(result.run_id)
                       if e.dagster_event_type is DagsterEventType.STEP_START]
            assert len(started) == 2
    return {lease.holder.split()[2]: lease for lease in leases_of(project.root / "gpu_legs")}


def test_two_legs_on_a_one_gpu_pool_take_turns(project, tmp_path, monkeypatch):
    leases = run_two_legs(tmp_path, project, [0], monkeypatch)
    assert set(leases) == {"leg_a", "leg_b"}
    assert [lease.cuda_visible_devices for lease in leases.values()] == ["0", "0"]
    assert overlapping_leases(list(leases.values())) == []
    first, second = sorted(leases.values(), key=lambda lease: lease.acquired_at)
    assert second.waited_s >= 2.0, second
    assert second.waited_on and second.waited_on[0].holder == first.holder


def test_two_legs_on_a_two_gpu_pool_run_at_once_on_different_devices(project, tmp_path, monkeypatch):
    """The control of the test above: with a device each, neither waits, and both hold at once."""
    leases = run_two_legs(tmp_path, project, [0, 1], monkeypatch)
    a, b = leases["leg_a"], leases["leg_b"]
    assert {a.cuda_visible_devices, b.cuda_visible_devices} == {"0", "1"}
    assert a.waited_s < 1.0 and b.waited_s < 1.0
    assert max(a.acquired_at, b.acquired_at) < min(a.released_at, b.released_at)  # held at the same time


def test_a_pool_smaller_than_the_request_fails_clearly(project, tmp_path, fake_producers):
    runner = LocalGpuLegRunner(devices=[0], gpus_per_leg=2, lock_dir=str(tmp_path / "locks"), producer_module=FAKE,
                               dry_run=True)
    instance, result = materialize_item(project, tmp_path, runner, EvidenceItem.BACKWARD)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type is DagsterEventType.STEP_FAILURE)
    message = failure.step_failure_data.error.message
    assert "asks for 2 GPU(s), the pool has 1 (devices [0]); it could never run here" in message
    assert not list((project.settings.legs_dir).rglob("report.json"))  # no producer was launched


def test_an_item_with_no_gpu_producer_fails_clearly(project, tmp_path, fake_producers):
    runner = LocalGpuLegRunner(devices=[0], lock_dir=str(tmp_path / "locks"), producer_module=FAKE, dry_run=True)
    _, result = materialize_item(project, tmp_path, runner, EvidenceItem.QUALITY)
    failure = next(e for e in result.all_events if e.event_type is DagsterEventType.STEP_FAILURE)
    assert "quality has no producer command here" in failure.step_failure_data.error.message


@pytest.mark.slow
@pytest.mark.long  # ~3.5 min on two cores; the short slice: test_forward_legs_run_through_pipes_on_the_leased_gpu
# (the same runner and Pipes with stand-in producers); the real producers ran on the H200 (calls/pipes receipts)
def test_the_real_producers_dry_run_through_pipes_on_the_leased_gpu(project, tmp_path, monkeypatch):
    """The producers themselves (tiny model, torch reference kernels, fake rollout: about two
    minutes on two cores), one step each way."""
    runner = LocalGpuLegRunner(devices=[2], lock_dir=str(tmp_path / "locks"), build_model="tiny", dry_run=True,
                               n_steps=1)
    instance, result = materialize_item(project, tmp_path, runner, EvidenceItem.FORWARD)
    assert result.success
    lines = pipes_lines(instance, result.run_id)
    assert any("pipes[bi1]: [tica" in line and "bi1 step 1" in line for line in lines), lines
    assert any("pipes[bi0]: [tica" in line and "bi0 step 1" in line for line in lines), lines
    assert any("pipes[make-model]: [tica" in line for line in lines), lines
    meta = forward_metadata(instance)
    assert meta["model"].value["source"].startswith("built: producers make-model --shape tiny")
    assert [r["name"] for r in meta["gpu_leases"].value] == ["make-model", "bi1", "bi0"]
    legs = [Path(p) for p in meta["leg_dirs"].value]
    assert [p.name for p in legs] == FORWARD_LEGS
    for leg in legs:
        leg_json = json.loads((leg / "leg.json").read_text())
        assert leg_json["env"]["CUDA_VISIBLE_DEVICES"] == "2" and leg_json["env"]["TICA_N_STEPS"] == "1"
        assert leg_json["processes"][0]["exit_code"] == 0
        assert check_seal(leg) == []
    # the canaries bi1 measured beside them are sealed too, though no item of this runner judges them
    assert (legs[0].parent / "forward_bi1_planted_fault" / "seal.json").is_file()
