"""What a leg records about the candidate it ran: the weights by the core fingerprint (the same
digest the manifest's checkpoint.path hashes to), the source checkout and the image, and when its
own work ran. And process records that name only real processes: an engine core that ran inside
the producer is never recorded as a process of its own."""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tica.fingerprint import FingerprintCache, fingerprint_checkpoint
from tica.legs import common, runner
from tica.models.hashing import weights_hash
from tica.models.tiny import build_tiny_llama
from tica.receipts import LegMeta
from tica.seal import check_seal

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "demo" / "candidates" / "cpu-tiny.yaml"


def t(stamp: str) -> dt.datetime:
    return dt.datetime.fromisoformat(stamp)


@pytest.fixture(scope="module")
def demo_tree(tmp_path_factory) -> Path:
    """demo/candidates/cpu-tiny.yaml, unchanged, beside the tiny model at the path it names
    (../../data/models/tiny-llama), built the way the demo and tests/legs build it."""
    root = tmp_path_factory.mktemp("demo-tree")
    (root / "demo" / "candidates").mkdir(parents=True)
    shutil.copy(MANIFEST, root / "demo" / "candidates" / MANIFEST.name)
    build_tiny_llama(root / "data" / "models" / "tiny-llama")
    return root


@pytest.fixture(scope="module")
def backward_leg(demo_tree, tmp_path_factory) -> tuple[Path, float, float, Path]:
    """A real CPU producer (backward, BI=0, the transformers trainer: no vLLM engine), with HOME
    elsewhere so a write to ~/.cache would show, and an image digest set by its launcher."""
    out = tmp_path_factory.mktemp("backward") / "leg"
    home = out.parent / "home"
    argv, env = runner.leg_command("backward", "bi0", out, model=str(demo_tree / "data" / "models" / "tiny-llama"))
    env = {k: v for k, v in env.items() if k != "TICA_CACHE_DIR"}
    env.update(HOME=str(home), TICA_IMAGE_DIGEST="sha256:" + "ab" * 32)
    t0 = time.time()
    proc = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    t1 = time.time()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out, t0, t1, home


def test_a_cpu_producers_weights_hash_is_the_manifests_weights_fingerprint(demo_tree, backward_leg, tmp_path):
    from tica.candidate import identify
    from tica.evidence import Component
    from tica.manifest import load_manifest

    leg, _, _, home = backward_leg
    identity = identify(load_manifest(demo_tree / "demo" / "candidates" / MANIFEST.name),
                        FingerprintCache(tmp_path / "cache.json"))
    recorded = json.loads((leg / "leg.json").read_text())["resolved_config"]["weights_hash"]
    assert recorded == identity.components[Component.WEIGHTS]
    assert recorded.startswith("blake3:")
    assert not (home / ".cache").exists()  # the producer wrote no shared cache file


def test_every_leg_records_source_image_and_when_its_work_ran(backward_leg):
    leg, t0, t1, _ = backward_leg
    meta = json.loads((leg / "leg.json").read_text())
    LegMeta.model_validate(meta)
    assert check_seal(leg) == []
    assert meta["source"] == {"repository": "tica", "commit": common.source_record()["commit"], "overlay_digest": None}
    assert meta["source"]["commit"]  # this checkout is a git checkout
    assert meta["image_digest"] == "sha256:" + "ab" * 32
    start, end = t(meta["started_at"]), t(meta["ended_at"])
    assert t0 < start.timestamp() < end.timestamp() < t1
    sealed = t(json.loads((leg / "seal.json").read_text())["sealed_at"])
    assert end <= sealed


def test_producers_hash_without_the_shared_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TICA_CACHE_DIR", str(tmp_path / "cache"))
    model = build_tiny_llama(tmp_path / "m")
    assert weights_hash(model) == fingerprint_checkpoint(model, persist=False) == fingerprint_checkpoint(model)
    assert (tmp_path / "cache" / "fingerprints.json").is_file()  # only the core's default call wrote it
    (tmp_path / "cache" / "fingerprints.json").unlink()
    weights_hash(model)
    assert not (tmp_path / "cache" / "fingerprints.json").exists()


def test_updated_weights_are_named_by_the_folder_that_was_reloaded(tmp_path):
    from tica.legs.update import write_updated_checkpoint
    from tica.legs.trainers import TransformersTrainer

    model = build_tiny_llama(tmp_path / "m")
    out = write_updated_checkpoint(TransformersTrainer(model), model, tmp_path / "leg" / "weights")
    assert weights_hash(out) == fingerprint_checkpoint(out, FingerprintCache(tmp_path / "c.json"))
    assert weights_hash(out) != weights_hash(model)  # the stamp is not copied: another folder, another digest


def test_the_fingerprint_module_needs_only_the_standard_library_blake3_and_psutil():
    """What a GPU node has: vLLM brings blake3 and psutil (both are vLLM requirements); nothing else
    of TICA's dependencies is imported."""
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        top = name.split('.')[0]\n"
        "        if top in sys.stdlib_module_names or top in ('blake3', 'psutil', 'tica'):\n"
        "            return None\n"
        "        raise ImportError(f'blocked: {name}')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import tica.fingerprint, tica.models.hashing, tica.legs.common, tica.source\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


# ---------------------------------------------------------------- when a leg's work ran


def test_a_leg_that_never_began_records_no_times(tmp_path):
    leg = common.Leg(tmp_path / "leg", item="forward", arm="bi0", producer="test", tee_log=False)
    time.sleep(0.01)
    leg.finish(not_run_reason="nothing ran")
    meta = json.loads((tmp_path / "leg" / "leg.json").read_text())
    assert meta["started_at"] is None and meta["ended_at"] is None


def test_a_legs_times_are_its_works_not_its_files(tmp_path):
    leg = common.Leg(tmp_path / "leg", item="forward", arm="bi0", producer="test", tee_log=False)
    time.sleep(0.05)
    leg.begin()
    time.sleep(0.05)
    leg.begin()  # the first call counts
    leg.end()
    ended = leg.meta["ended_at"]
    time.sleep(0.05)
    before_finish = common.now()
    leg.finish()
    meta = json.loads((tmp_path / "leg" / "leg.json").read_text())
    assert meta["ended_at"] == ended < before_finish
    assert t(meta["ended_at"]) - t(meta["started_at"]) >= dt.timedelta(seconds=0.05)  # from the first begin()


def test_a_leg_stopped_by_an_error_ends_its_work_there(tmp_path):
    leg = common.Leg(tmp_path / "leg", item="forward", arm="bi0", producer="test")
    leg.begin()
    with pytest.raises(RuntimeError):
        with leg.errors_recorded():
            raise RuntimeError("engine died")
    meta = json.loads((tmp_path / "leg" / "leg.json").read_text())
    assert meta["started_at"] <= meta["ended_at"] and meta["errors"] == ["RuntimeError: engine died"]


def test_a_bi1_leg_not_run_records_the_check_as_its_work(tmp_path, monkeypatch):
    from tica.legs import engine
    from tica.legs.forward import bi1_not_run

    monkeypatch.setattr(engine, "bi1_unsupported_reason", lambda: "vLLM says no")
    leg = common.Leg(tmp_path / "leg", item="forward", arm="bi1", producer="test", tee_log=False)
    time.sleep(0.05)
    opened = common.now()
    assert bi1_not_run(leg, SimpleNamespace(arm="bi1"), common._StdoutPipes().log)
    meta = json.loads((tmp_path / "leg" / "leg.json").read_text())
    assert meta["not_run_reason"] == "vLLM says no" and opened <= meta["started_at"] <= meta["ended_at"]


def test_vllm_kernels_legs_take_their_times_from_the_producer(tmp_path):
    from tica.legs.vllm_kernels import legio

    started = legio.now()
    meta = legio.new_meta("forward", "bi1", trainer="vllm_kernels", started_at=started)
    time.sleep(0.02)
    legio.write_meta(tmp_path / "a", meta)
    written = json.loads((tmp_path / "a" / "leg.json").read_text())
    assert written["started_at"] == started and written["ended_at"] is None  # nothing stamped at write time
    assert written["source"]["repository"] == "tica" and "image_digest" in written
    LegMeta.model_validate(written)


def test_vllm_kernels_legs_record_the_node_they_ran_on(tmp_path):
    """The throughput judge's one-node rule reads resolved_config.node: the vLLM-kernels writer
    records this host as the common writer does (run13's throughput legs, written before, record
    none and cannot pass), and keeps a node a producer recorded itself."""
    from tica.items.throughput.judge import NODE_KEYS
    from tica.legs.common import this_node
    from tica.legs.vllm_kernels import legio

    legio.write_meta(tmp_path / "a", legio.new_meta("throughput", "bi0", trainer=None, round=1, slot=1, concurrency=1))
    written = json.loads((tmp_path / "a" / "leg.json").read_text())
    assert "resolved_config.node" in NODE_KEYS and written["resolved_config"]["node"] == this_node()
    meta = legio.new_meta("throughput", "bi1", trainer=None)
    meta["resolved_config"] = {"node": "rank-0 host", "model": "m"}
    legio.write_meta(tmp_path / "b", meta)
    assert json.loads((tmp_path / "b" / "leg.json").read_text())["resolved_config"] == {"node": "rank-0 host", "model": "m"}


# ---------------------------------------------------------------- engine exits are real processes


def _sleep_forever(ready=None) -> None:  # a stand-in EngineCore: a real child process, ended by SIGTERM
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not whatever handler the test process holds
    if ready is not None:
        ready.set()
    time.sleep(600)


class _MPCore:
    """vLLM's SyncMPClient as shutdown_and_record sees it: its engine manager's processes."""

    def __init__(self, procs) -> None:
        self.resources = SimpleNamespace(engine_manager=SimpleNamespace(processes=procs))

    def shutdown(self, timeout=None) -> None:
        for p in self.resources.engine_manager.processes:
            p.terminate()


class InprocClient:
    """vLLM's in-process engine core client (VLLM_ENABLE_V1_MULTIPROCESSING=0): no processes."""

    def shutdown(self, timeout=None) -> None:
        pass


def test_an_engine_core_of_its_own_is_recorded_with_its_own_pid_and_exit(tmp_path):
    from tica.legs import engine

    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    child = ctx.Process(target=_sleep_forever, args=(ready,), name="EngineCore_DP0")
    child.start()
    # SIGTERM before the child restored the default action would meet the test process's handler
    assert ready.wait(30)
    llm = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=_MPCore([child])))
    leg = common.Leg(tmp_path / "leg", item="forward", arm="bi0", producer="test", tee_log=False)
    engine.shutdown_and_record(llm, leg)
    (core,) = [p for p in leg.processes if p["role"] == "engine_core"]
    assert core["pid"] == child.pid != os.getpid()
    assert core["exit_code"] == -15 and core["end_state"] == "signalled" and core["name"] == "EngineCore_DP0"
    assert "engine_core_process" not in leg.meta["resolved_config"]


def test_an_engine_core_inside_the_producer_gets_no_record(tmp_path):
    from tica.legs import engine

    llm = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=InprocClient()))
    leg = common.Leg(tmp_path / "leg", item="forward", arm="bi0", producer="test", tee_log=False)
    engine.shutdown_and_record(llm, leg)
    assert leg.processes == []
    assert "inside the producer process" in leg.meta["resolved_config"]["engine_core_process"]


def test_each_h200_throughput_leg_takes_the_times_of_its_own_bench_run(tmp_path, monkeypatch):
    """`producers bench-client` (one process running every leg's `vllm bench serve` in order) writes
    each leg's own run times; cmd_throughput gives them to that leg (vLLM's bench stood in for)."""
    import argparse
    import types

    from tica.legs.vllm_kernels import producers

    ran: list[str] = []

    def fake_main(args) -> None:
        time.sleep(0.05)
        ran.append(args.result_filename)

    class Parser(argparse.ArgumentParser):  # vLLM's takes all of bench serve's flags; this one, one
        def parse_args(self, argv=None, namespace=None):
            return self.parse_known_args(argv, namespace)[0]

    serve = types.ModuleType("vllm.benchmarks.serve")
    serve.add_cli_args = lambda parser: parser.add_argument("--result-filename")
    serve.main = fake_main
    argutils = types.ModuleType("vllm.utils.argparse_utils")
    argutils.FlexibleArgumentParser = Parser
    for name in ("vllm", "vllm.benchmarks", "vllm.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.benchmarks.serve", serve)
    monkeypatch.setitem(sys.modules, "vllm.utils.argparse_utils", argutils)
    plan = [{"arm": arm, "round": 1, "slot": slot, "c": 1, "num_prompts": 2, "num_warmups": 1}
            for slot, arm in enumerate(("bi0", "bi1"), 1)]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"plan": plan, "ports": {"bi0": 1, "bi1": 2}, "tokenizer": "t", "in": 8, "out": 4,
                                "deadline": time.time() + 600, "results": str(tmp_path / "bench")}))
    assert producers.cmd_bench_client(SimpleNamespace(spec=str(spec))) == 0
    assert ran == ["throughput_bi0_r1_c1.json", "throughput_bi1_r1_c1.json"]
    first, second = (producers.bench_times(tmp_path / "bench", f"throughput_{arm}_r1_c1") for arm in ("bi0", "bi1"))
    assert first["started_at"] < first["ended_at"] <= second["started_at"] < second["ended_at"]
    assert t(first["ended_at"]) - t(first["started_at"]) >= dt.timedelta(seconds=0.05)
    assert producers.bench_times(tmp_path / "bench", "throughput_bi0_r2_c1") == {}  # never ran: no times
    # and what each ran under, as the strict model reads it: each server's first leg served none before
    from tica.receipts import LegTelemetry

    for arm in ("bi0", "bi1"):
        tel = LegTelemetry(**json.loads((tmp_path / "bench" / f"throughput_{arm}_r1_c1.telemetry.json").read_text()))
        assert tel.served_before == 0 and tel.cuda_graphs is None and tel.cpu_load_1m_end is not None
    # and the processes that served it, read alive after its end: here the client (this process), the
    # only one the spec names; a server it names that is gone is left out, never guessed
    from tica.receipts import LiveProcess

    for arm in ("bi0", "bi1"):
        (alive,) = [LiveProcess(**e) for e in json.loads((tmp_path / "bench" / f"throughput_{arm}_r1_c1.alive.json").read_text())]
        times = producers.bench_times(tmp_path / "bench", f"throughput_{arm}_r1_c1")
        assert (alive.role, alive.pid) == ("client", os.getpid()) and alive.read_at >= times["ended_at"]
    # no server answered /metrics here: the leg's prefix-cache hits and preemptions are unknown, not 0
    for arm in ("bi0", "bi1"):
        tel = json.loads((tmp_path / "bench" / f"throughput_{arm}_r1_c1.telemetry.json").read_text())
        assert tel["prefix_cache_hit_rate"] is None and tel["preemptions"] is None
