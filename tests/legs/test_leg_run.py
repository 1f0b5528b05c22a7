"""`tica leg run`: any command as a sealed leg. Each test names the rule it holds; fake commands
(small Python scripts) make the rules fast to check, and one real run (marked slow) drives
`vllm bench serve` against a CPU vLLM server that `tica leg run` starts itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tica import leg_run
from tica.cli import leg as leg_run_cli
from tica.receipts import load_bench_leg, load_leg
from tica.seal import check_seal

PY = sys.executable

FAKE_BENCH = textwrap.dedent("""
    # writes what `vllm bench serve --save-result` writes (the fields the judge reads), and the
    # arm switch it saw, then exits with $FAKE_RC
    import json, os, sys
    args = sys.argv[1:]
    out = args[args.index("--result-filename") + 1]
    json.dump({"num_prompts": 4, "max_concurrency": 2, "duration": 2.0, "completed": 4, "failed": 0,
               "total_input_tokens": 128, "total_output_tokens": 32, "request_throughput": 2.0,
               "output_throughput": 16.0, "total_token_throughput": 80.0,
               "seen_bi": os.environ.get("VLLM_BATCH_INVARIANT"), "seen_extra": os.environ.get("VLLM_EXTRA_SWITCH")},
              open(out, "w"))
    print("fake bench done")
    sys.exit(int(os.environ.get("FAKE_RC", "0")))
""")

FAKE_SERVER = textwrap.dedent("""
    # answers /health 200, writes the arm switch it saw, exits 0 on SIGTERM
    import http.server, json, os, signal, sys, threading
    port, seen = int(sys.argv[sys.argv.index("--port") + 1]), sys.argv[sys.argv.index("--seen") + 1]
    json.dump({"bi": os.environ.get("VLLM_BATCH_INVARIANT")}, open(seen, "w"))
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404); self.end_headers()
        def log_message(self, *a): pass
    srv = http.server.HTTPServer(("127.0.0.1", port), H)
    signal.signal(signal.SIGTERM, lambda *a: (print("stopping", flush=True), threading.Thread(target=srv.shutdown).start()))
    print("serving", flush=True)
    srv.serve_forever()
    sys.exit(int(os.environ.get("FAKE_SERVER_RC", "0")))
""")


def _free_port() -> int:
    from tica.legs.throughput import free_port

    return free_port()


@pytest.fixture
def work(tmp_path) -> Path:
    (tmp_path / "fake_bench.py").write_text(FAKE_BENCH)
    (tmp_path / "fake_server.py").write_text(FAKE_SERVER)
    return tmp_path


def _bench_spec(work: Path, arm: str, out: str = "leg", **kw) -> leg_run.LegRunSpec:
    return leg_run.LegRunSpec(out=work / out, item="throughput", arm=arm, round=1, slot=1,
                              command=[PY, "fake_bench.py", "--result-filename", "b.json"],
                              collect=["bench.json=b.json"], cwd=work, **kw)


def _meta(leg: Path) -> dict:
    return json.loads((leg / "leg.json").read_text())


# ------------------------------------------------------------------ what every leg records


@pytest.mark.parametrize("arm, bi", [("bi1", "1"), ("bi0", "0")])
def test_the_arm_sets_the_switch_the_command_sees_and_the_leg_records_it(work, arm, bi):
    outcome = leg_run.run_leg(_bench_spec(work, arm, env={"VLLM_EXTRA_SWITCH": "x"}))
    meta = _meta(outcome.leg_dir)
    bench = json.loads((outcome.leg_dir / "bench.json").read_text())
    assert bench["seen_bi"] == bi and meta["env"]["VLLM_BATCH_INVARIANT"] == bi
    assert bench["seen_extra"] == "x" and meta["env"]["VLLM_EXTRA_SWITCH"] == "x"  # every switch set is recorded
    assert meta["arm"] == arm and (meta["round"], meta["slot"]) == (1, 1)


def test_leg_json_records_producer_versions_times_and_the_command_exit(work):
    meta = _meta(leg_run.run_leg(_bench_spec(work, "bi0")).leg_dir)
    assert (meta["producer"], meta["item"]) == ("tica leg run", "throughput")
    import tica

    assert meta["producer_version"] == tica.__version__
    # the versions of the command's own Python (here: this venv); None = not installed there
    assert meta["versions"]["python"] and meta["versions"]["torch"] and meta["versions"]["vllm"]
    assert set(meta["versions"]) >= {"vllm", "torch", "transformers", "megatron-core", "lm_eval", "verl"}
    assert meta["started_at"] <= meta["ended_at"]
    [client] = meta["processes"]
    assert client["role"] == "client" and client["exit_code"] == 0 and client["end_state"] == "exited"
    assert client["command"][1] == "fake_bench.py"
    assert meta["concurrency"] == 2  # from the result file's max_concurrency: observed, not flagged
    assert (outcome_log := (work / "leg" / "command.log").read_text()) and "fake bench done" in outcome_log


def test_the_collected_result_is_sealed_and_reads_as_a_throughput_leg(work):
    leg = leg_run.run_leg(_bench_spec(work, "bi0")).leg_dir
    assert check_seal(leg) == []
    assert sorted(p.name for p in leg.iterdir()) == ["bench.json", "command.log", "leg.json", "seal.json"]
    bench_leg = load_bench_leg(leg)
    assert (bench_leg.arm, bench_leg.round, bench_leg.slot, bench_leg.concurrency) == ("bi0", 1, 1, 2)
    assert _meta(leg)["resolved_config"]["collected"] == {"bench.json": str(work / "b.json")}


def test_a_command_that_fails_leaves_a_sealed_leg_with_its_exit(work, monkeypatch):
    monkeypatch.setenv("FAKE_RC", "3")
    rc = leg_run_cli.main(["run", "--out", str(work / "leg"), "--item", "throughput", "--arm", "bi0",
                           "--cwd", str(work), "--collect", "bench.json=b.json",
                           "--", PY, "fake_bench.py", "--result-filename", "b.json"])
    assert rc == 1  # sealed, and says the command failed
    leg = load_leg(work / "leg")  # the seal verifies and leg.json validates
    [client] = leg.meta.processes
    assert (client.end_state, client.exit_code) == ("exited", 3)
    from tica.process_exits import exit_problems

    assert "client: client pid" in " ".join(exit_problems(leg.meta))  # a failed leg is evidence of failure


def test_a_command_past_its_timeout_is_recorded_as_signalled(work):
    spec = leg_run.LegRunSpec(out=work / "leg", item="forward", arm="bi1", cwd=work, timeout=1,
                              command=[PY, "-c", "import time; time.sleep(60)"])
    meta = _meta(leg_run.run_leg(spec).leg_dir)
    [trainer] = meta["processes"]
    assert trainer["role"] == "trainer"  # a forward/backward/update command is the trainer
    assert (trainer["end_state"], trainer["signal"]) == ("signalled", signal.SIGTERM.value)
    assert "--timeout 1 s" in trainer["evidence"]


def test_a_command_that_cannot_start_is_recorded_not_invented(work):
    spec = leg_run.LegRunSpec(out=work / "leg", item="forward", arm="bi0", cwd=work, command=["./no-such-trainer"])
    meta = _meta(leg_run.run_leg(spec).leg_dir)
    [trainer] = meta["processes"]
    assert trainer["exit_code"] is None and trainer["end_state"] == "gone"
    assert meta["started_at"] is None and meta["ended_at"] is None  # nothing ran: no times
    assert any("could not start" in e for e in meta["errors"])


# ------------------------------------------------------------------ unknown is a value


def test_without_nvidia_smi_no_device_name_is_invented(monkeypatch):
    def no_smi(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    device = leg_run.probe_device(run=no_smi)
    assert device["kind"] == "cpu" and device["probe"] == "nvidia-smi not found"
    assert "name" not in device and "driver" not in device and "capability" not in device


def test_nvidia_smi_gives_the_gpus_cuda_visible_devices_names(monkeypatch):
    rows = ("0, GPU-aaa, NVIDIA H200, 570.86, 143771 MiB, 9.0\n"
            "1, GPU-bbb, NVIDIA H200, 570.86, 143771 MiB, 9.0\n")

    def smi(argv, **k):
        return subprocess.CompletedProcess(argv, 0, rows, "")

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    device = leg_run.probe_device(run=smi)
    assert device == {"kind": "cuda", "name": "NVIDIA H200", "driver": "570.86", "memory_total": "143771 MiB",
                      "count": 1, "probe": "nvidia-smi", "capability": "9.0"}


def test_a_command_whose_python_is_unknown_records_no_versions(work):
    (work / "train.sh").write_text("#!/bin/sh\necho step 1\n")
    (work / "train.sh").chmod(0o755)
    meta = _meta(leg_run.run_leg(leg_run.LegRunSpec(out=work / "leg", item="backward", arm="bi0", cwd=work,
                                                    command=["./train.sh"])).leg_dir)
    assert meta["versions"] == {}  # unknown: not "not installed"
    assert "not known" in meta["resolved_config"]["versions_from"]
    assert meta["kernels"] == {} and "weights_hash" not in meta["resolved_config"]
    assert "trainer" not in meta and "profiled" not in meta  # not given, not observed: absent


def test_vllm_defaults_for_absent_bench_flags_are_not_recorded(tmp_path):
    reading = leg_run.read_bench_command(["--model", "m", "--max-concurrency", "2", "--save-result"], tmp_path)
    for key in ("num_warmups", "input_len", "output_len", "ignore_eos", "dataset_name", "num_prompts"):
        assert key not in reading.config, key  # vLLM's default (0 warm-ups, 1024 tokens, ...) is not an observation
    assert reading.config["max_concurrency"] == 2


def test_bench_flags_are_read_as_vllm_reads_them(tmp_path):
    reading = leg_run.read_bench_command(
        ["--random-input-len", "64", "--input-len", "32", "--random_output_len=8", "--num-warmups", "1",
         "--num-warmups", "2", "--ignore-eos", "--metadata", "arm=bi1", "round=2", "--num-prompts", "6",
         "--save-result", "--result-dir", "res", "--result-filename", "x.json"], tmp_path)
    c = reading.config
    assert (c["input_len"], c["output_len"], c["num_warmups"], c["ignore_eos"], c["num_prompts"]) == (32, 8, 2, True, 6)
    assert reading.sources["input_len"] == "command line: --input-len 32"  # --input-len overrides (serve.py)
    assert reading.metadata == {"arm": "bi1", "round": "2"}
    assert reading.outputs == {"bench.json": tmp_path / "res" / "x.json"}


def test_an_abbreviated_flag_leaves_its_value_unknown(tmp_path):
    reading = leg_run.read_bench_command(["--num-warmups", "1", "--num-warm", "3"], tmp_path)
    assert "num_warmups" not in reading.config and any("--num-warm" in n for n in reading.notes)


def test_a_vllm_engine_exit_nobody_reported_is_not_recorded_a_force_kill_is():
    log = ("(APIServer pid=10) WARNING [shutdown] Process manager: force killing remaining processes count=1\n"
           "(APIServer pid=10) WARNING [shutdown] Process manager: force killing remaining process EngineCore pid 11\n")
    recs, unobserved = leg_run.engine_records(log, engine_pids=[11, 12], worker_pids=[], names={12: "VLLM::EngineCor"},
                                              alive={11: False, 12: False})
    [forced] = recs
    assert (forced["role"], forced["pid"], forced["end_state"]) == ("engine_core", 11, "force_killed")
    assert unobserved == [{"role": "engine_core", "pid": 12, "name": "VLLM::EngineCor"}]  # unknown: left out


def test_an_output_the_command_did_not_write_is_not_collected(work):
    (work / "stale.json").write_text("{}")
    os.utime(work / "stale.json", (1, 1))
    spec = leg_run.LegRunSpec(out=work / "leg", item="forward", arm="bi0", cwd=work, collect=["metrics.jsonl=stale.json"],
                              command=[PY, "-c", "pass"])
    meta = _meta(leg_run.run_leg(spec).leg_dir)
    assert not (work / "leg" / "metrics.jsonl").exists()
    assert any("unchanged by the command" in e for e in meta["errors"])


# ------------------------------------------------------------------ refused before anything runs


def test_a_switch_contradicting_the_arm_is_refused_before_running(work, monkeypatch, capsys):
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    rc = leg_run_cli.main(["run", "--out", str(work / "leg"), "--item", "throughput", "--arm", "bi0",
                           "--", PY, "-c", "pass"])
    assert rc == 4 and not (work / "leg").exists()
    assert "contradicts --arm bi0" in capsys.readouterr().err


def test_metadata_contradicting_the_leg_is_refused(work):
    spec = leg_run.LegRunSpec(out=work / "leg", item="throughput", arm="bi0", round=1, cwd=work,
                              command=["vllm", "bench", "serve", "--metadata", "arm=bi0", "round=2"])
    with pytest.raises(leg_run.LegRunError, match="round=2"):
        leg_run.run_leg(spec)
    assert not (work / "leg").exists()


def test_a_leg_is_never_rewritten(work):
    leg_run.run_leg(_bench_spec(work, "bi0"))
    with pytest.raises(leg_run.LegRunError, match="already a sealed leg"):
        leg_run.run_leg(_bench_spec(work, "bi0"))


# ------------------------------------------------------------------ servers


def test_a_server_tica_starts_gets_the_arm_and_its_exit_is_recorded(work):
    port = _free_port()
    spec = _bench_spec(work, "bi0", server_cmd=[PY, "fake_server.py", "--port", str(port), "--seen", "seen.json"],
                       server_timeout=30)
    meta = _meta(leg_run.run_leg(spec).leg_dir)
    assert json.loads((work / "seen.json").read_text()) == {"bi": "0"}
    roles = {p["role"]: p for p in meta["processes"]}
    assert set(roles) == {"client", "api_server"}  # no EngineCore observed: none recorded, none invented
    assert (roles["api_server"]["end_state"], roles["api_server"]["exit_code"]) == ("exited", 0)
    assert "SIGTERM" in roles["api_server"]["evidence"]
    server = meta["resolved_config"]["server"]
    assert server["url"] == f"http://127.0.0.1:{port}" and server["ready_at"] <= meta["started_at"]
    assert "stopping" in (work / "leg" / "server.log").read_text()


def test_a_server_that_never_gets_ready_leaves_a_leg_without_a_client(work):
    spec = _bench_spec(work, "bi0", server_cmd=[PY, "-c", "import sys; sys.exit(5)"], server_url="http://127.0.0.1:9",
                       server_timeout=30)
    meta = _meta(leg_run.run_leg(spec).leg_dir)
    [server] = meta["processes"]
    assert (server["role"], server["exit_code"]) == ("api_server", 5)
    assert any("was not run" in e for e in meta["errors"]) and meta["started_at"] is None


def _running_server(work: Path, bi: str, code: str) -> subprocess.Popen:
    env = {**os.environ, "VLLM_BATCH_INVARIANT": bi}
    return subprocess.Popen([PY, "-c", code], env=env, cwd=work)


def test_a_running_server_of_the_other_arm_is_refused(work):
    server = _running_server(work, "1", "import time; time.sleep(30)")
    try:
        with pytest.raises(leg_run.LegRunError, match="not a bi0 server"):
            leg_run.run_leg(_bench_spec(work, "bi0", server_pid=server.pid))
    finally:
        server.kill()
        server.wait()


@pytest.mark.serial  # 0.3 s for the server to start
def test_a_running_server_still_running_is_recorded_running_never_clean(work):
    server = _running_server(work, "0", "import time; time.sleep(30)")
    try:
        time.sleep(0.3)
        meta = _meta(leg_run.run_leg(_bench_spec(work, "bi0", server_pid=server.pid)).leg_dir)
    finally:
        server.kill()
        server.wait()
    api = next(p for p in meta["processes"] if p["role"] == "api_server")
    assert (api["pid"], api["end_state"], api["exit_code"]) == (server.pid, "running", None)
    assert meta["resolved_config"]["server"]["env"]["VLLM_BATCH_INVARIANT"] == "0"


@pytest.mark.serial  # the server must end mid-leg
def test_a_running_server_that_ends_during_the_leg_records_what_could_be_seen(work):
    # the server ends while the command runs; its parent (this test) has not reaped it yet, so its
    # exit status is readable from /proc: recorded. Reaped, it would be `gone` with no code.
    server = _running_server(work, "0", "import sys, time; time.sleep(1); sys.exit(7)")
    time.sleep(0.3)
    spec = _bench_spec(work, "bi0", server_pid=server.pid)
    spec.command = [PY, "-c", "import time; time.sleep(2.5)"]
    spec.collect = []
    spec.item = "clean_exit"
    meta = _meta(leg_run.run_leg(spec).leg_dir)
    server.wait()
    api = next(p for p in meta["processes"] if p["role"] == "api_server")
    assert (api["end_state"], api["exit_code"]) == ("exited", 7)
    assert "zombie" in api["evidence"]


# ------------------------------------------------------------------ a `vllm bench serve` command named vllm


def test_a_vllm_bench_serve_command_has_its_result_file_collected_as_bench_json(work):
    """`vllm bench serve` without --result-filename: vLLM names the file by date; the one new JSON
    in --result-dir is collected. The console script's `#!` line names its Python."""
    fake_vllm = work / "bin" / "vllm"
    fake_vllm.parent.mkdir()
    fake_vllm.write_text(f"#!{PY}\n" + textwrap.dedent("""
        import json, sys, os
        a = sys.argv[1:]
        d = a[a.index("--result-dir") + 1]
        os.makedirs(d, exist_ok=True)
        json.dump({"num_prompts": 2, "max_concurrency": 1, "duration": 1.0, "completed": 2, "total_input_tokens": 8,
                   "total_output_tokens": 4, "request_throughput": 2.0, "output_throughput": 4.0},
                  open(os.path.join(d, "vllm-infqps-concurrency1-m-20260101-000000.json"), "w"))
    """))
    fake_vllm.chmod(0o755)
    (work / "res").mkdir()
    (work / "res" / "older-run.json").write_text("{}")
    spec = leg_run.LegRunSpec(out=work / "leg", item="throughput", arm="bi1", cwd=work,
                              command=[str(fake_vllm), "bench", "serve", "--max-concurrency", "1", "--num-prompts", "2",
                                       "--num-warmups", "1", "--save-result", "--result-dir", "res",
                                       "--metadata", "round=3", "slot=2"])
    meta = _meta(leg_run.run_leg(spec).leg_dir)
    assert meta["resolved_config"]["command_kind"] == "vllm bench serve"
    assert (meta["round"], meta["slot"], meta["concurrency"]) == (3, 2, 1)  # from its own arguments
    assert meta["resolved_config"]["num_warmups"] == 1
    assert meta["versions"]["python"]  # read from the Python its #! line names
    assert "errors" not in meta, meta.get("errors")
    assert load_bench_leg(work / "leg").bench.num_prompts == 2


# ------------------------------------------------------------------ a real vLLM server on the CPU

# `vllm bench serve` against a CPU vLLM server `tica leg run` starts, the real tools end to end:
# tests/legs/test_walkthrough_report.py runs that leg (its BI=0 throughput leg, the same workload
# and server) and asserts there what this file asserted of it (exits, workload, receipt, clean exit).


@pytest.mark.serial  # a log line 1 s in, after the leg began
def test_a_running_servers_log_is_read_from_where_the_leg_began(work):
    """A force kill logged before the leg is another leg's; one logged during it is this leg's."""
    log = work / "server.out"
    log.write_text("WARNING [shutdown] Process manager: force killing remaining process EngineCore pid 99\n")
    code = ("import time; time.sleep(1); open('server.out', 'a').write("
            "'WARNING [shutdown] Process manager: force killing remaining process EngineCore pid 123\\n'); time.sleep(30)")
    server = _running_server(work, "0", code)
    try:
        spec = leg_run.LegRunSpec(out=work / "leg", item="clean_exit", arm="bi0", cwd=work, server_pid=server.pid,
                                  server_log=log, command=[PY, "-c", "import time; time.sleep(2)"])
        meta = _meta(leg_run.run_leg(spec).leg_dir)
    finally:
        server.kill()
        server.wait()
    engines = [p for p in meta["processes"] if p["role"] == "engine_core"]
    assert [(p["pid"], p["end_state"]) for p in engines] == [(123, "force_killed")]
    assert "pid 99" not in (work / "leg" / "server.log").read_text()
    assert meta["resolved_config"]["server"]["log_from_byte"] > 0


def test_an_lm_eval_command_line_is_recorded_and_its_output_path_collected(tmp_path):
    reading = leg_run.read_command(["lm_eval", "--model", "vllm", "--model_args", "pretrained=/m,dtype=bfloat16",
                                    "--tasks", "gsm8k", "--num_fewshot", "5", "--limit", "10", "--apply_chat_template",
                                    "--output_path", "out"], tmp_path)
    assert reading.kind == "lm_eval" and reading.config["model"] == "/m"
    assert reading.config["lm_eval"] == {"model": "vllm", "model_args": "pretrained=/m,dtype=bfloat16", "tasks": "gsm8k",
                                         "num_fewshot": 5, "limit": 10.0, "apply_chat_template": True,
                                         "output_path": "out"}
    assert reading.outputs == {"lm_eval": tmp_path / "out"}
    assert "seed" not in reading.config["lm_eval"]  # lm_eval's default seeds are not this run's record
