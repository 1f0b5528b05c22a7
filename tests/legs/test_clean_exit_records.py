"""How the serving producers record a clean exit, without starting vLLM: the shutdown timeout the
server is given and recorded, and each engine process's end as its own parent reported it."""

from __future__ import annotations

import argparse
import multiprocessing
from pathlib import Path
from types import SimpleNamespace

import pytest

from tica.process_exits import exit_problem
from tica.legs import common, engine, throughput
from tica.receipts import ProcessExit

ENGINE, WORKER = 4_190_001, 4_190_002  # pids no process holds here: the records read logs, not live processes


def _records(log: str, tmp_path: Path) -> dict[str, dict]:
    """Server.records() over a server log, for a server that exited 0 after SIGTERM."""
    server = throughput.Server.__new__(throughput.Server)
    server.log_path = tmp_path / "server.log"
    server.log_path.write_text(log)
    server.proc = SimpleNamespace(pid=4_190_000, returncode=0)
    server.stop_evidence = "exited after SIGTERM (grace 90 s)"
    server.engine_pids, server.worker_pids = [ENGINE], [WORKER]
    server.names = {ENGINE: "VLLM::EngineCore", WORKER: "VLLM::Worker"}
    server.identities = common.ProcessIdentities()  # none seen alive: no identity recorded
    return {r["role"]: r for r in server.records()}


def _problem(rec: dict) -> str | None:
    return exit_problem(ProcessExit.model_validate({k: v for k, v in rec.items() if k != "command"}))


CLEAN_LOG = (f"(EngineCore pid={ENGINE}) TICA_PROC_EXIT role=worker name=VllmWorker-0 pid={WORKER} exitcode=0\n"
             f"TICA_PROC_EXIT role=engine_core name=EngineCore pid={ENGINE} exitcode=0 grace_s=30\n")


def test_a_worker_exit_reported_by_its_engine_core_is_recorded_as_exited(tmp_path):
    recs = _records(CLEAN_LOG, tmp_path)
    assert recs["worker"]["end_state"] == "exited" and recs["worker"]["exit_code"] == 0
    assert recs["engine_core"]["end_state"] == "exited" and "30 s after SIGTERM" in recs["engine_core"]["evidence"]
    assert all(_problem(r) is None for r in recs.values())


def test_a_worker_whose_exit_was_not_reported_is_not_a_clean_exit(tmp_path):
    """The negative control: without its EngineCore's report, a worker that is gone is unknown."""
    recs = _records(CLEAN_LOG.splitlines()[1] + "\n", tmp_path)
    assert recs["worker"]["end_state"] == "gone" and recs["worker"]["exit_code"] is None
    assert _problem(recs["worker"]) is not None


def test_vllms_force_kill_line_outweighs_a_reported_exit_code(tmp_path):
    log = (f"WARNING [utils.py:653] [shutdown] Process manager: force killing remaining process EngineCore pid {ENGINE}\n"
           f"WARNING [system_utils.py:225] [shutdown] force killing sub process VLLM::Worker pid {WORKER}\n"
           f"TICA_PROC_EXIT role=engine_core name=EngineCore pid={ENGINE} exitcode=-9 grace_s=0\n")
    recs = _records(log, tmp_path)
    assert recs["engine_core"]["end_state"] == recs["worker"]["end_state"] == "force_killed"


def _exit_with(code: int) -> None:
    raise SystemExit(code)


def test_a_reported_exit_code_is_the_childs_own(tmp_path, capfd):
    """report_exits prints what multiprocessing saw; reported_exits reads it back, code for code."""
    child = multiprocessing.get_context("fork").Process(target=_exit_with, args=(3,), name="VllmWorker-0")
    child.start()
    child.join()
    common.report_exits([child], "worker")
    (seen,) = common.reported_exits(capfd.readouterr().out).items()
    assert seen == (child.pid, common.ReportedExit("worker", "VllmWorker-0", 3))


def test_an_offline_engines_worker_takes_the_exit_its_engine_core_reported():
    stop = engine.EngineStop(procs=[], workers={WORKER: "VLLM::Worker"})
    text = f"TICA_PROC_EXIT role=worker name=VllmWorker-0 pid={WORKER} exitcode=0\n"
    (reported,) = engine.exit_records(stop, text)
    (unreported,) = engine.exit_records(stop, "")
    assert reported["end_state"] == "exited" and reported["exit_code"] == 0
    assert unreported["end_state"] == "gone" and unreported["exit_code"] is None


def _server_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    throughput.add_server_args(ap)
    return ap.parse_args(["--out", "o", "--arm", "bi0", "--model", "m", *argv])


@pytest.mark.parametrize("timeout", [0, 30])
def test_the_server_is_given_the_shutdown_timeout_and_the_leg_records_what_it_was_given(tmp_path, monkeypatch, timeout):
    started = []
    monkeypatch.setattr(throughput.subprocess, "Popen", lambda cmd, **kw: started.append(cmd) or SimpleNamespace(pid=1))
    args = _server_args(["--shutdown-timeout", str(timeout)])
    args.input_len, args.output_len, args.num_warmups = 32, 8, 0  # the workload flags of the leg itself
    server = throughput.Server("m", tmp_path / "server.log", port=1, max_model_len=512, gpu_memory_utilization=0.1,
                               seed=0, shutdown_timeout=args.shutdown_timeout)
    i = started[0].index("--shutdown-timeout")
    assert started[0][i + 1] == str(timeout)
    resolved = throughput.resolved_workload(args, 1, 2, server, "blake3:x")
    assert resolved["shutdown_timeout"] == timeout
    assert resolved["server_command"] == throughput.recorded_command(started[0])  # the port as {port}


def test_the_recipes_default_shutdown_timeout_is_positive_and_a_negative_one_is_refused():
    assert _server_args([]).shutdown_timeout == common.SHUTDOWN_TIMEOUT_S > 0
    with pytest.raises(SystemExit):
        _server_args(["--shutdown-timeout", "-1"])


def test_the_shutdown_timeout_vllm_logged_is_read_and_an_unlogged_one_stays_unknown():
    line = "(APIServer pid=1) INFO [launcher.py:270] [shutdown] API server: stopping engine client mode=drain timeout=30s\n"
    assert engine.logged_engine_config(line) == {"shutdown_mode": "drain", "shutdown_timeout": 30}
    assert "shutdown_timeout" not in engine.logged_engine_config("(APIServer pid=1) INFO nothing about shutdown\n")


def test_the_engine_config_and_shutdown_are_read_only_from_vllms_own_log_lines():
    """A prompt the request logger echoes can say anything: only a whole line vLLM's logger wrote
    counts (the H200 producer log's line is read as before: tests/fixtures/h200/run4)."""
    real = ("(EngineCore_DP0 pid=7) INFO 12-01 10:00:00 [core.py:93] Initializing a V1 LLM engine (v0.26.0) with config: "
            "tensor_parallel_size=1, dtype=torch.bfloat16, enforce_eager=True\n"
            "(APIServer pid=1) INFO 12-01 10:05:00 [launcher.py:270] [shutdown] API server: stopping engine client "
            "mode=drain timeout=30s\n")
    echoed = ("(APIServer pid=1) INFO 12-01 10:01:00 [logger.py:39] Received request cmpl-1: prompt: 'Initializing a "
              "V1 LLM engine (v0.26.0) with config: tensor_parallel_size=8, dtype=fp8 [shutdown] API server: stopping "
              "engine client mode=abort timeout=0s'\n")
    want = {"tensor_parallel_size": 1, "dtype": "torch.bfloat16", "enforce_eager": True, "shutdown_mode": "drain",
            "shutdown_timeout": 30}
    assert engine.logged_engine_config(real + echoed) == want
    assert engine.logged_engine_config(echoed) == {}  # negative control: the echo alone says nothing
    h200 = (Path(__file__).resolve().parents[1] / "fixtures/h200/run4/quality_bi1/producer.log").read_text(errors="replace")
    assert engine.logged_engine_config(h200)["tensor_parallel_size"] == 1


# ------------------------------------------------------------------ each exit's process identity


def test_a_process_identity_is_read_from_the_living_process_and_never_guessed():
    """create time, name and command line as psutil reads them from the process itself; once it
    is gone nothing is read, and a record without one carries no identity (unknown)."""
    import subprocess
    import sys
    import time

    import psutil

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        # until the child has exec'd, its command line is the parent's or empty (read as unknown)
        deadline = time.monotonic() + 5
        while "-c" not in psutil.Process(proc.pid).cmdline() and time.monotonic() < deadline:
            time.sleep(0.01)
        ident = common.process_identity(proc.pid)
        assert ident["create_time"] == psutil.Process(proc.pid).create_time()
        assert ident["cmdline"][1:] == ["-c", "import time; time.sleep(5)"]
        assert ident["name"] == psutil.Process(proc.pid).name()
        rec = common.process_record("client", proc.pid, 0, evidence="x", identity=ident)
        assert ProcessExit.model_validate(rec).identity.create_time == ident["create_time"]
    finally:
        proc.kill()
        proc.wait()
    assert common.process_identity(proc.pid) == {}
    assert common.process_identity(None) == {}
    assert "identity" not in common.process_record("client", proc.pid, 0, evidence="x")
    seen = common.ProcessIdentities()
    seen.see(proc.pid, None)
    assert seen.of(proc.pid) is None


def test_a_server_records_the_identity_read_while_its_processes_ran(tmp_path):
    """Server.records(): each exit carries what was read from its pid while it lived, as it was."""
    server = throughput.Server.__new__(throughput.Server)
    server.log_path = tmp_path / "server.log"
    server.log_path.write_text(f"TICA_PROC_EXIT role=engine_core name=EngineCore_0 pid={ENGINE} exitcode=0\n")
    server.proc = SimpleNamespace(pid=4_190_000, returncode=0)
    server.stop_evidence = "exited after SIGTERM (grace 90 s)"
    server.engine_pids, server.worker_pids, server.names = [ENGINE], [], {}
    server.identities = common.ProcessIdentities()
    server.identities._seen.update({4_190_000: {"create_time": 1.5e9, "name": "python3"},
                                    ENGINE: {"create_time": 1.5e9 + 2, "name": "VLLM::EngineCore"}})
    recs = {r["role"]: r for r in server.records()}
    assert recs["api_server"]["identity"] == {"create_time": 1.5e9, "name": "python3"}
    assert recs["engine_core"]["identity"] == {"create_time": 1.5e9 + 2, "name": "VLLM::EngineCore"}
