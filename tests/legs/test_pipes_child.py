"""The Pipes child that runs one H200 producer command on a leased GPU: it refuses to run on a
device other than its lease, stops a producer past its time and still seals what it wrote with
the exit it observed, and never leaves a producer running after its launcher is gone."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from tica.legs.vllm_kernels import pipes_child
from tica.seal import check_seal

REPO = Path(__file__).resolve().parents[2]
SLEEPY = """
import os, sys, time
from pathlib import Path
from tica.legs.vllm_kernels import legio
args = sys.argv[1:]
legs = Path(args[args.index("--legs") + 1])
Path(os.environ["SLEEPY_PID"]).write_text(str(os.getpid()))
legio.write_meta(legs / "forward_bi1_decode", legio.new_meta("forward", "bi1", trainer="vllm_kernels"))
print("[tica] leg written", flush=True)
if os.environ.get("SLEEPY_ORPHAN"):  # leaves a process behind, holding our stdout
    import subprocess
    kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    Path(os.environ["SLEEPY_ORPHAN"]).write_text(str(kid.pid))
time.sleep(float(os.environ.get("SLEEPY_S", "0")))
"""


@pytest.fixture
def sleepy(tmp_path, monkeypatch) -> Path:
    (tmp_path / "sleepy_producer.py").write_text(SLEEPY)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("SLEEPY_PID", str(tmp_path / "producer.pid"))
    return tmp_path


def child_args(tmp_path: Path, *extra: str) -> list[str]:
    return ["--name", "bi1", "--legs", str(tmp_path / "legs"), "--report", str(tmp_path / "report.json"),
            "--producer-module", "sleepy_producer", *extra, "--", "bi1", "--legs", str(tmp_path / "legs")]


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def run_in_process(tmp_path: Path, monkeypatch, seen_uuid: str, leased: str) -> int:
    probe = f'import json; print(json.dumps({{"count": 1, "devices": [{{"uuid": "{seen_uuid}", "name": "H200"}}]}}))'
    monkeypatch.setattr(pipes_child, "DEVICE_PROBE", probe)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("TICA_GPU_LEASE_UUIDS", leased)
    argv = child_args(tmp_path, "--check-device")
    cut = argv.index("--")
    ns = argparse.Namespace(name="bi1", legs=str(tmp_path / "legs"), report=str(tmp_path / "report.json"), log="",
                            timeout=60.0, check_device=True, producer_module="sleepy_producer")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return pipes_child.run(ns, argv[cut + 1:])
    finally:  # run() installs its own; the test process keeps its own
        for s, h in handlers.items():
            signal.signal(s, h)


def test_a_child_seeing_another_device_than_its_lease_does_not_run_the_producer(sleepy, tmp_path, monkeypatch):
    code = run_in_process(tmp_path, monkeypatch, seen_uuid="8f1f0000-0000-0000-0000-00000000aaaa",
                          leased="GPU-8f1f0000-0000-0000-0000-00000000bbbb")
    report = json.loads((tmp_path / "report.json").read_text())
    assert code == pipes_child.DEVICE_MISMATCH
    assert report["device_check"]["ok"] is False and report["rc"] is None
    assert not (tmp_path / "producer.pid").exists()


def test_a_child_seeing_its_leased_device_runs_the_producer(sleepy, tmp_path, monkeypatch):
    """Control of the test above: the same UUID, written torch's way and nvidia-smi's way."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    code = run_in_process(tmp_path, monkeypatch, seen_uuid="8f1f0000-0000-0000-0000-00000000aaaa",
                          leased="GPU-8F1F0000-0000-0000-0000-00000000AAAA")
    report = json.loads((tmp_path / "report.json").read_text())
    assert code == 0 and report["device_check"]["ok"] is True and report["rc"] == 0
    (leg,) = [Path(p) for p in report["legs"]]
    assert check_seal(leg) == []
    meta = json.loads((leg / "leg.json").read_text())
    assert meta["env"]["CUDA_VISIBLE_DEVICES"] == "1"
    # one record, of the one process the child waited on: the producer's own pid, not the child's;
    # no EngineCore copied from it (an in-process engine core has no process of its own)
    producer = int((tmp_path / "producer.pid").read_text())
    (trainer,) = meta["processes"]
    assert trainer["role"] == "trainer" and trainer["pid"] == producer == report["pid"] != os.getpid()
    assert trainer["exit_code"] == 0 and trainer["end_state"] == "exited"


def test_the_real_producers_dry_run_records_what_ran(tmp_path, monkeypatch):
    """`producers bi0 --dry-run` (tiny model, HF trainer, the fake rollout) through the child: the
    leg names its weights by the core fingerprint of the model folder, records the checkout and the
    image, its work's own times inside the producer's lifetime, and only real processes."""
    from tica.fingerprint import FingerprintCache, fingerprint_checkpoint
    from tica.legs.vllm_kernels.producers import make_model
    from tica.receipts import LegMeta

    model = tmp_path / "m"
    make_model(model, "tiny", seed=1, device="cpu")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("TICA_N_STEPS", "2")
    monkeypatch.setenv("TICA_IMAGE_DIGEST", "sha256:" + "cd" * 32)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TICA_CACHE_DIR", raising=False)
    legs = tmp_path / "legs"
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "tica.legs.vllm_kernels.pipes_child", "--name", "bi0", "--legs",
                           str(legs), "--report", str(tmp_path / "report.json"), "--", "bi0", "--model", str(model),
                           "--legs", str(legs), "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=600)
    t1 = time.time()
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["rc"] == 0, (tmp_path / "bi0.log").read_text()[-3000:] if (tmp_path / "bi0.log").exists() else report
    leg = legs / "forward_bi0_hf"
    assert check_seal(leg) == []
    meta = json.loads((leg / "leg.json").read_text())
    LegMeta.model_validate(meta)
    fp = fingerprint_checkpoint(model, FingerprintCache(tmp_path / "cache.json"))
    assert meta["resolved_config"]["weights_hash"] == fp
    assert {json.loads(x)["checkpoint_version"] for x in (leg / "metrics.jsonl").read_text().splitlines()} == {fp}
    assert not (tmp_path / "home" / ".cache").exists()
    assert meta["source"]["repository"] == "tica" and meta["source"]["commit"]
    assert meta["image_digest"] == "sha256:" + "cd" * 32
    start, end = (datetime.fromisoformat(meta[k]).timestamp() for k in ("started_at", "ended_at"))
    assert t0 < start < end < t1
    (trainer,) = meta["processes"]
    assert trainer["role"] == "trainer" and trainer["pid"] == report["pid"] and trainer["exit_code"] == 0
    # the producer read itself alive after the work, as the process its launcher records (clean exit's
    # rule for one trainer process behind several legs)
    (alive,) = meta["alive_at_end"]
    assert (alive["role"], alive["pid"]) == ("trainer", trainer["pid"])
    assert alive["identity"]["create_time"] == trainer["identity"]["create_time"] <= start
    assert datetime.fromisoformat(alive["read_at"]).timestamp() >= end


@pytest.mark.serial  # a 3 s timeout on a producer's start
def test_a_producer_past_its_time_is_stopped_and_its_leg_sealed_with_that_exit(sleepy, tmp_path, monkeypatch):
    monkeypatch.setenv("SLEEPY_S", "120")
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "tica.legs.vllm_kernels.pipes_child",
                           *child_args(tmp_path, "--timeout", "3")],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert time.time() - t0 < 30
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["rc"] == -signal.SIGTERM and report["stopped"] == ["timeout 3 s"]
    (leg,) = [Path(p) for p in report["legs"]]
    trainer = json.loads((leg / "leg.json").read_text())["processes"][0]
    assert trainer["exit_code"] == -signal.SIGTERM and trainer["end_state"] == "signalled"
    assert check_seal(leg) == []


def test_what_a_producer_leaves_behind_is_killed_when_it_exits(sleepy, tmp_path, monkeypatch):
    monkeypatch.setenv("SLEEPY_ORPHAN", str(tmp_path / "orphan.pid"))
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "tica.legs.vllm_kernels.pipes_child", *child_args(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert time.time() - t0 < 30  # not held up by the orphan keeping the producer's stdout open
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["rc"] == 0 and report["stragglers_killed"] is True
    orphan = int((tmp_path / "orphan.pid").read_text())
    t0 = time.time()
    while alive(orphan):
        assert time.time() - t0 < 10, f"orphan {orphan} of the producer still runs"
        time.sleep(0.1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_producer_dies_with_its_launcher(sleepy, tmp_path, monkeypatch):
    """The lease is the launcher's flock: when the launcher dies the GPU is free again, so its
    producer must not go on using it."""
    monkeypatch.setenv("SLEEPY_S", "120")
    child = [sys.executable, "-m", "tica.legs.vllm_kernels.pipes_child", *child_args(tmp_path)]
    launch = f"import subprocess, time; subprocess.Popen({child!r}); time.sleep(120)"
    launcher = subprocess.Popen([sys.executable, "-c", launch], cwd=REPO)
    pid_file = tmp_path / "producer.pid"
    t0 = time.time()
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.time() - t0 < 60, "the producer never started"
        time.sleep(0.05)
    producer = int(pid_file.read_text())
    assert alive(producer)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    t0 = time.time()
    while alive(producer):
        assert time.time() - t0 < 20, f"producer {producer} outlived its launcher"
        time.sleep(0.1)
