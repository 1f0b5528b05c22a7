"""The GPU pool: one invariant per test, contenders in their own processes (flock is per open
file, so only separate processes show what two legs on one machine would see)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from tica.gpu_pool import (
    GpuDevice,
    GpuLease,
    GpuPool,
    GpuPoolBusy,
    GpuPoolConfig,
    GpuPoolTooSmall,
    NoGpuFound,
    discover_gpus,
    overlapping_leases,
)

REPO = Path(__file__).resolve().parents[2]

CONTENDER = r"""
import json, os, signal, sys, time
from pathlib import Path
from tica.gpu_pool import GpuPool, GpuPoolConfig
cfg, n, holder, hold_s, out, crash = json.loads(sys.argv[1])
def publish(path, text):  # whole or not at all: a reader polling for the file never sees it half written
    Path(path + ".tmp").write_text(text)
    os.replace(path + ".tmp", path)
with GpuPool(GpuPoolConfig.model_validate(cfg)).lease(n, holder) as lease:
    publish(out + ".ready", lease.model_dump_json())
    if crash:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(hold_s)
publish(out, lease.model_dump_json())
"""


def at(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def pool_config(tmp_path: Path, n: int = 1, **kw) -> GpuPoolConfig:
    return GpuPoolConfig(devices=[GpuDevice(index=i, uuid=f"GPU-fake-{i}") for i in range(n)],
                         lock_dir=tmp_path / "locks", poll_s=0.05, **kw)


def contend(config: GpuPoolConfig, holder: str, out: Path, *, n: int = 1, hold_s: float = 0.0,
            crash: bool = False) -> subprocess.Popen:
    args = json.dumps([json.loads(config.model_dump_json()), n, holder, hold_s, str(out), crash])
    return subprocess.Popen([sys.executable, "-c", CONTENDER, args], cwd=REPO)


def wait_ready(out: Path, proc: subprocess.Popen, timeout: float = 60) -> GpuLease:
    ready = Path(str(out) + ".ready")
    t0 = time.time()
    while not ready.exists():
        assert proc.poll() is None or ready.exists(), f"contender exited {proc.returncode} before leasing"
        assert time.time() - t0 < timeout, "contender never leased"
        time.sleep(0.02)
    return GpuLease.model_validate_json(ready.read_text())


def finished(out: Path, proc: subprocess.Popen) -> GpuLease:
    assert proc.wait(timeout=60) == 0
    return GpuLease.model_validate_json(out.read_text())


@pytest.mark.serial  # contenders in processes, timed holds
@pytest.mark.processes
def test_a_second_process_waits_while_the_one_gpu_is_held(tmp_path):
    config = pool_config(tmp_path, 1)
    first = contend(config, "leg-a", tmp_path / "a.json", hold_s=1.5)
    wait_ready(tmp_path / "a.json", first)
    second = contend(config, "leg-b", tmp_path / "b.json")
    a, b = finished(tmp_path / "a.json", first), finished(tmp_path / "b.json", second)
    assert a.indices == b.indices == [0]
    assert b.waited_s >= 0.5, b
    assert b.waited_on and b.waited_on[0].holder == "leg-a" and b.waited_on[0].pid == a.pid
    assert overlapping_leases([a, b]) == []


@pytest.mark.serial  # two holds must overlap in time
@pytest.mark.processes
def test_without_locking_two_leases_overlap_and_the_detector_says_so(tmp_path):
    """Negative control of the test above: the same contention with locking off shares GPU 0,
    and the overlap detector (used on the proof's records) must catch it."""
    config = pool_config(tmp_path, 1, locking=False)
    first = contend(config, "leg-a", tmp_path / "a.json", hold_s=1.5)
    wait_ready(tmp_path / "a.json", first)
    second = contend(config, "leg-b", tmp_path / "b.json", hold_s=0.3)
    a, b = finished(tmp_path / "a.json", first), finished(tmp_path / "b.json", second)
    assert b.waited_s < 0.5
    overlaps = overlapping_leases([a, b])
    assert [(o.index, o.first, o.second) for o in overlaps] == [(0, "leg-a", "leg-b")]


@pytest.mark.serial  # waited_s < 0.5 beside a 1.5 s hold
@pytest.mark.processes
def test_two_legs_on_a_two_gpu_pool_run_at_once_on_different_devices(tmp_path):
    config = pool_config(tmp_path, 2)
    first = contend(config, "leg-a", tmp_path / "a.json", hold_s=1.5)
    wait_ready(tmp_path / "a.json", first)
    second = contend(config, "leg-b", tmp_path / "b.json", hold_s=0.2)
    a, b = finished(tmp_path / "a.json", first), finished(tmp_path / "b.json", second)
    assert {a.cuda_visible_devices, b.cuda_visible_devices} == {"0", "1"}
    assert b.waited_s < 0.5
    assert at(b.acquired_at) < at(a.released_at)  # b ran while a still held its device
    assert overlapping_leases([a, b]) == []


@pytest.mark.serial  # waited_s < 1 after the holder's SIGKILL
@pytest.mark.processes
def test_a_crashed_holders_lock_dies_with_it(tmp_path):
    config = pool_config(tmp_path, 1)
    holder = contend(config, "leg-crashes", tmp_path / "a.json", crash=True)
    wait_ready(tmp_path / "a.json", holder)
    assert holder.wait(timeout=30) == -9
    with GpuPool(config).lease(1, "leg-after", timeout_s=2) as lease:
        assert lease.indices == [0] and lease.waited_s < 1


@pytest.mark.serial  # a 0.5 s bound timed to < 3 s
@pytest.mark.processes
def test_a_bounded_wait_names_the_busy_devices_and_their_holders(tmp_path):
    config = pool_config(tmp_path, 1)
    holder = contend(config, "run 1234abcd forward/bi1", tmp_path / "a.json", hold_s=5)
    held = wait_ready(tmp_path / "a.json", holder)
    t0 = time.monotonic()
    with pytest.raises(GpuPoolBusy) as err:
        with GpuPool(config).lease(1, "leg-b", timeout_s=0.5):
            pass
    assert 0.5 <= time.monotonic() - t0 < 3
    assert "GPU 0 held by run 1234abcd forward/bi1" in str(err.value) and f"pid {held.pid}" in str(err.value)
    assert err.value.busy[0].holder == "run 1234abcd forward/bi1"
    holder.kill()
    holder.wait()


@pytest.mark.serial  # a 0.5 s sleep, then a 1 s bound
@pytest.mark.processes
def test_a_multi_gpu_lease_keeps_nothing_while_it_waits(tmp_path):
    """All or none: a leg waiting for 2 GPUs does not sit on the free one."""
    config = pool_config(tmp_path, 2)
    on_one = contend(config, "leg-on-gpu1", tmp_path / "a.json", hold_s=3)
    # occupy GPU 0 first, so the contender gets GPU 1
    with GpuPool(config).lease(1, "leg-on-gpu0"):
        wait_ready(tmp_path / "a.json", on_one)
    wants_two = contend(config, "leg-wants-two", tmp_path / "b.json", n=2)
    time.sleep(0.5)
    with GpuPool(config).lease(1, "leg-small", timeout_s=1) as small:
        assert small.indices == [0]
    assert finished(tmp_path / "b.json", wants_two).indices == [0, 1]
    finished(tmp_path / "a.json", on_one)


def test_asking_for_more_gpus_than_the_pool_has_fails_at_once(tmp_path):
    pool = GpuPool(pool_config(tmp_path, 1))
    t0 = time.monotonic()
    with pytest.raises(GpuPoolTooSmall, match=r"asks for 2 GPU\(s\), the pool has 1 \(devices \[0\]\)"):
        with pool.lease(2, "leg-greedy"):
            pass
    assert time.monotonic() - t0 < 0.5


def test_a_lease_gives_the_child_exactly_its_devices_in_pci_order(tmp_path):
    with GpuPool(pool_config(tmp_path, 3)).lease(2, "leg") as lease:
        env = lease.child_env()
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                   "TICA_GPU_LEASE_UUIDS": "GPU-fake-0,GPU-fake-1"}
    assert lease.released_at and lease.held_s is not None


def test_discovery_reads_nvidia_smi(tmp_path):
    out = "0, GPU-aaaa, NVIDIA H200\n1, GPU-bbbb, NVIDIA H200\n"
    found = discover_gpus(run=lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=out, stderr=""))
    assert found == [GpuDevice(index=0, uuid="GPU-aaaa", name="NVIDIA H200"),
                     GpuDevice(index=1, uuid="GPU-bbbb", name="NVIDIA H200")]


@pytest.mark.parametrize("answer", [
    subprocess.CompletedProcess([], 0, stdout="", stderr=""),
    subprocess.CompletedProcess([], 9, stdout="", stderr="NVIDIA-SMI has failed: no driver"),
    FileNotFoundError("nvidia-smi"),
])
def test_discovery_with_no_gpu_is_a_clear_error(answer):
    def run(*a, **k):
        if isinstance(answer, Exception):
            raise answer
        return answer

    with pytest.raises(NoGpuFound, match="no GPU pool"):
        discover_gpus(run=run)
