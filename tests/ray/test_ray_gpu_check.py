"""The Ray track's GPU bookkeeping without a cluster: which GPU a leg job names (tica.legs.gpu_identity),
what a throughput leg asks Ray for (RayLegRunner.gpus_for), and the overlap check over the runner's
records (resources.ray_gpu_check)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from resources.legs import LegSpec
from resources.ray_gpu_check import check
from tica.evidence import EvidenceItem
from tica.legs import gpu_identity

REPO = Path(__file__).resolve().parents[2]


def _rec(item: str, leg: str, start: str, end: str, visible: str = "0", host: str = "10.0.0.1",
         uuid: str = "unknown", status: str = "SUCCEEDED", num_gpus: float = 1.0) -> dict:
    devices = [{"visible": v, "uuid": uuid} for v in visible.split(",") if v]
    return {"item": item, "leg": leg, "status": status, "node_ip": host, "num_gpus": num_gpus,
            "ended_at": f"2026-12-07T10:00:{end}+00:00",
            "gpu": {"started_at": f"2026-12-07T10:00:{start}+00:00", "cuda_visible_devices": visible,
                    "devices": devices}}


def test_a_throughput_leg_overlapping_another_on_its_gpu_is_named():
    got = check([_rec("throughput", "bi1-r1-s1", "00", "10"), _rec("forward", "bi1-s1", "05", "12")])
    assert not got.ok and len(got.overlaps) == 1
    assert got.overlaps[0].startswith("throughput leg throughput/bi1-r1-s1 shared GPU 0 on 10.0.0.1 with forward/bi1-s1")


@pytest.mark.parametrize("other", [
    _rec("forward", "bi1-s1", "10", "20"),  # starts as the throughput leg ends: one after the other
    _rec("forward", "bi1-s1", "05", "12", visible="1"),  # the host's other GPU
    _rec("forward", "bi1-s1", "05", "12", host="10.0.0.2"),  # another host's GPU 0
    _rec("forward", "bi1-s1", "05", "12", visible="", num_gpus=0),  # no GPU of its own
    _rec("forward", "bi1-s1", "05", "12", status="NOT_STARTED"),  # never ran
])
def test_a_throughput_leg_alone_on_its_gpu_passes(other):
    got = check([_rec("throughput", "bi1-r1-s1", "00", "10"), other])
    assert got.ok, got


def test_one_gpu_uuid_on_two_hosts_is_one_gpu():
    a = _rec("throughput", "bi1-r1-s1", "00", "10", uuid="GPU-1", host="h1")
    b = _rec("quality", "bi0-s2", "02", "04", uuid="GPU-1", host="h2", visible="3")
    assert check([a, b]).overlaps


def test_a_leg_that_ran_without_a_gpu_record_fails_the_check():
    rec = _rec("forward", "bi1-s1", "00", "10")
    rec["gpu"] = None
    got = check([_rec("throughput", "bi1-r1-s1", "20", "30"), rec])
    assert not got.ok and got.unknown == ["forward/bi1-s1: no GPU record (tica.legs.gpu_identity wrote none), "
                                          "so its device is unknown"]


def test_throughput_legs_ask_ray_for_a_whole_gpu_whatever_num_gpus_says():
    from resources.ray_legs import RayLegRunner

    for n, want in ((0.0, 1.0), (0.5, 1.0), (1.0, 1.0), (1.5, 2.0)):
        runner = RayLegRunner(address="http://h:8265", shared_dir="/s", num_gpus=n)
        assert runner.gpus_for(LegSpec(EvidenceItem.THROUGHPUT, "bi1", round=1, slot=1)) == want
        assert runner.gpus_for(LegSpec(EvidenceItem.FORWARD, "bi1", slot=1)) == n


def test_identify_names_the_uuid_nvidia_smi_gives_and_unknown_where_it_gives_none(monkeypatch):
    rows = [{"index": "0", "uuid": "GPU-a", "name": "H100"}, {"index": "1", "uuid": "GPU-b", "name": "H100"}]
    monkeypatch.setattr(gpu_identity, "_nvidia_smi", lambda: (rows, None))
    got = gpu_identity.identify({"CUDA_VISIBLE_DEVICES": "1"})
    assert got["uuid"] == "GPU-b" and got["devices"][0]["index"] == "1" and got["unread_because"] is None
    monkeypatch.setattr(gpu_identity, "_nvidia_smi", lambda: ([], "nvidia-smi unavailable: FileNotFoundError"))
    got = gpu_identity.identify({"CUDA_VISIBLE_DEVICES": "1"})
    assert got["uuid"] == "unknown" and got["unread_because"] == "nvidia-smi unavailable: FileNotFoundError"
    assert gpu_identity.identify({})["devices"] == [] and gpu_identity.identify({})["uuid"] is None


@pytest.mark.processes
def test_the_entrypoint_gives_a_gpu_less_leg_no_device_and_execs_the_producer(tmp_path):
    show = "import json, os; print(json.dumps({k: os.environ.get(k) for k in ('CUDA_VISIBLE_DEVICES', 'TICA_GPU_UUID')}))"
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "3", "PATH": "/nonexistent"}
    for gpus, want_cvd, want_uuid in (("0", "", None), ("1", "3", "unknown")):
        record = tmp_path / f"leg{gpus}.gpu.json"
        out = subprocess.run([sys.executable, "-m", "tica.legs.gpu_identity", "--record", str(record), "--",
                              sys.executable, "-c", show], env={**env, "TICA_LEG_GPUS": gpus},
                             capture_output=True, text=True, check=True, cwd=str(REPO))
        assert json.loads(out.stdout) == {"CUDA_VISIBLE_DEVICES": want_cvd, "TICA_GPU_UUID": want_uuid}
        assert json.loads(record.read_text())["cuda_visible_devices"] == want_cvd
