"""`tica leg run` records only what happened: each test holds one rule the ingest audit found broken
(F2, F3, F5, F6, F7, F8, S2, S4 in its report) with its negative control, the honest run that still
records a clean exit (or no error). Real subprocesses throughout: small Python scripts stand in for
the command and the server, as in test_leg_run.py; no vLLM, seconds each."""

from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tica import leg_run
from tica.cli import leg as leg_run_cli
from tica.judges import judge_criteria
from tica.process_exits import exit_problem, exit_problems
from tica.question import parse_question
from tica.receipts import ProcessExit, load_bench_leg, load_leg
from tica.verdict import Verdict

from tests.legs.test_leg_run import PY, _bench_spec, _free_port, _meta, work  # noqa: F401 (work: a fixture)

SERVER = textwrap.dedent("""
    # /health answers --health (default 200); on SIGTERM prints the file --on-term names ({pid}:
    # its own pid) and exits 0, or ignores SIGTERM (--ignore-term); --retitle: retitles itself as
    # vLLM's EngineCore does (setproctitle)
    import http.server, os, signal, sys, threading
    a = sys.argv
    if "--retitle" in a:
        import setproctitle
        setproctitle.setproctitle("VLLM::EngineCore")
    port = int(a[a.index("--port") + 1])
    health = int(a[a.index("--health") + 1]) if "--health" in a else 200
    on_term = open(a[a.index("--on-term") + 1]).read() if "--on-term" in a else ""
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(health if self.path == "/health" else 404); self.end_headers()
        def log_message(self, *a): pass
    srv = http.server.HTTPServer(("127.0.0.1", port), H)
    def stop(*_):
        sys.stdout.write(on_term.replace("{pid}", str(os.getpid()))); sys.stdout.flush()
        threading.Thread(target=srv.shutdown).start()
    signal.signal(signal.SIGTERM, signal.SIG_IGN if "--ignore-term" in a else stop)
    print("serving", flush=True)
    srv.serve_forever()
""")

WRAPPER = textwrap.dedent("""
    # a launcher that runs the server as its child with VLLM_BATCH_INVARIANT=argv[1]
    import os, signal, subprocess, sys
    child = subprocess.Popen([sys.executable, "server.py", *sys.argv[2:]],
                             env={**os.environ, "VLLM_BATCH_INVARIANT": sys.argv[1]})
    signal.signal(signal.SIGTERM, lambda *a: child.send_signal(signal.SIGTERM))
    sys.exit(child.wait())
""")

GRACEFUL = textwrap.dedent("""
    # a job with a graceful shutdown handler: SIGTERM and Ctrl-C both exit 0
    import pathlib, signal, sys, time
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *a: sys.exit(0))
    pathlib.Path("started").write_text("1")
    time.sleep(float(sys.argv[1]))
""")

CLEAN_EXIT = parse_question({
    "name": "trust-clean-exit", "item": "clean_exit", "compared": "x", "computation": "x", "pass_line": "x",
    "noise_floor": 0.0, "repeats": 1, "pairing_order": ["AB"], "invalid_leg_rule": "none",
    "criteria": {"item": "clean_exit", "required_roles": ["client", "api_server"]}})


@pytest.fixture
def box(work) -> Path:
    (work / "server.py").write_text(SERVER)
    (work / "wrapper.py").write_text(WRAPPER)
    (work / "graceful.py").write_text(GRACEFUL)
    return work


def _server(port: int, *extra: str) -> list[str]:
    return [PY, "server.py", "--port", str(port), *extra]


def _clean_exit_spec(box: Path, out: str = "leg", **kw) -> leg_run.LegRunSpec:
    kw.setdefault("command", [PY, "graceful.py", "0.2"])
    kw.setdefault("server_cmd", _server(_free_port()))
    kw.setdefault("server_timeout", 30)
    return leg_run.LegRunSpec(out=box / out, item="clean_exit", arm="bi1", cwd=box, **kw)


def _roles(meta: dict) -> dict[str, dict]:
    return {p["role"]: p for p in meta["processes"]}


def _clean(meta: dict) -> bool:
    return all(exit_problem(ProcessExit.model_validate({k: v for k, v in p.items() if k != "command"})) is None
               for p in meta["processes"])


def _honest(box: Path, out: str = "honest", **kw) -> dict:
    """The negative control: the same leg, nothing tampered with, records clean exits and no error."""
    meta = _meta(leg_run.run_leg(_clean_exit_spec(box, out, **kw)).leg_dir)
    assert "errors" not in meta, meta.get("errors")
    assert _clean(meta) and {p["end_state"] for p in meta["processes"]} == {"exited"}
    return meta


# ------------------------------------------------------------------ F2: what TICA itself stopped is not a clean exit


@pytest.mark.serial  # its handler in before a 1 s timeout
def test_a_command_tica_stopped_at_its_timeout_is_signalled_even_when_it_exits_0(box):
    meta = _meta(leg_run.run_leg(_clean_exit_spec(box, command=[PY, "graceful.py", "60"], timeout=1)).leg_dir)
    client = _roles(meta)["client"]
    assert client["exit_code"] == 0  # what the process chose on its way out: recorded as seen
    assert (client["end_state"], client["signal"]) == ("signalled", signal.SIGTERM.value)
    assert any("did not end by itself" in e and "--timeout 1 s" in e for e in meta["errors"])
    assert judge_criteria("clean_exit", CLEAN_EXIT, [box / "leg"]).verdict is Verdict.FAIL
    # negative control: the command that ends by itself is a clean exit, and the cell passes
    _honest(box)
    assert judge_criteria("clean_exit", CLEAN_EXIT, [box / "honest"]).verdict is Verdict.PASS


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt here, as in a terminal, even when this test process was
    started in the background (SIGINT ignored from the start)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.serial  # SIGINT 0.3 s after the command began
def test_ctrl_c_passed_on_to_the_command_is_recorded_signalled_sigint(box, ctrl_c_raises):
    def interrupt_once_started():
        deadline = time.monotonic() + 20
        while not (box / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # tica leg run is waiting on the command by now
        os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=interrupt_once_started)
    t.start()
    try:
        meta = _meta(leg_run.run_leg(_clean_exit_spec(box, command=[PY, "graceful.py", "60"])).leg_dir)
    except KeyboardInterrupt:
        pytest.fail("the Ctrl-C reached the test: tica leg run did not pass it on")
    finally:
        t.join()
    roles = _roles(meta)
    assert roles["client"]["exit_code"] == 0
    assert (roles["client"]["end_state"], roles["client"]["signal"]) == ("signalled", signal.SIGINT.value)
    # the server was stopped because the leg was interrupted: not its end-of-leg stop either
    assert (roles["api_server"]["end_state"], roles["api_server"]["signal"]) == ("signalled", signal.SIGTERM.value)
    assert any("SIGINT" in e for e in meta["errors"]) and any("interrupted" in e for e in meta["errors"])
    assert exit_problems(load_leg(box / "leg").meta)
    _honest(box)


def test_a_server_stopped_before_any_command_ran_is_signalled_not_clean(box):
    spec = _clean_exit_spec(box, server_cmd=_server(_free_port(), "--health", "503"), server_timeout=2)
    meta = _meta(leg_run.run_leg(spec).leg_dir)
    api = _roles(meta)["api_server"]
    assert api["exit_code"] == 0 and (api["end_state"], api["signal"]) == ("signalled", signal.SIGTERM.value)
    assert any("outside the end-of-leg stop" in e for e in meta["errors"])
    honest = _honest(box)
    assert "SIGTERM" in _roles(honest)["api_server"]["evidence"]  # the documented clean path: SIGTERM, then exit 0


def test_a_server_tica_had_to_sigkill_is_killed_and_an_error(box):
    spec = _clean_exit_spec(box, server_cmd=_server(_free_port(), "--ignore-term"), server_stop_timeout=1)
    meta = _meta(leg_run.run_leg(spec).leg_dir)
    api = _roles(meta)["api_server"]
    assert (api["end_state"], api["signal"]) == ("killed", signal.SIGKILL.value)
    assert any("sent SIGKILL" in e for e in meta["errors"])
    _honest(box)


# ------------------------------------------------------------------ F3 / S4: the environment the processes ran with


def _bi(records: list[dict]) -> list[tuple[str, str | None]]:
    return [(r["role"], r.get("VLLM_BATCH_INVARIANT")) for r in records if r["environ"] == "read"]


def test_a_server_whose_own_environment_says_the_other_arm_is_an_error(box):
    port = _free_port()
    spec = _clean_exit_spec(box, server_cmd=["env", "VLLM_BATCH_INVARIANT=0", *_server(port)])
    meta = _meta(leg_run.run_leg(spec).leg_dir)
    assert meta["env"]["VLLM_BATCH_INVARIANT"] == "1"  # what TICA passed
    assert meta["resolved_config"]["server"]["env"]["VLLM_BATCH_INVARIANT"] == "0"  # what the server ran with
    [bad] = [e for e in meta["errors"] if "VLLM_BATCH_INVARIANT" in e]
    assert "server pid" in bad and "VLLM_BATCH_INVARIANT=0" in bad and "VLLM_BATCH_INVARIANT=1" in bad
    honest = _honest(box)
    assert _bi(honest["resolved_config"]["server"]["environ_read"]) == [("server", "1")]


def test_a_server_child_of_the_other_arm_is_an_error(box):
    spec = _clean_exit_spec(box, server_cmd=[PY, "wrapper.py", "0", "--port", str(_free_port())])
    meta = _meta(leg_run.run_leg(spec).leg_dir)
    assert ("server child", "0") in _bi(meta["resolved_config"]["server"]["environ_read"])
    assert any("server child pid" in e and "VLLM_BATCH_INVARIANT=0" in e for e in meta["errors"])
    # negative control: the launcher's child of the arm's own value
    honest = _honest(box, server_cmd=[PY, "wrapper.py", "1", "--port", str(_free_port())])
    assert _bi(honest["resolved_config"]["server"]["environ_read"]) == [("server", "1"), ("server child", "1")]


@pytest.mark.serial  # reads /proc/<pid>/environ of processes a moment after their start (a loaded run failed it)
def test_a_child_that_retitled_itself_has_an_unknown_environment_not_an_unset_switch(box):
    """setproctitle (vLLM's EngineCore and workers) overwrites the memory /proc/<pid>/environ shows:
    what is left there is not the environment, so the child's switch is unknown, never `(unset)`."""
    meta = _meta(leg_run.run_leg(_clean_exit_spec(
        box, server_cmd=[PY, "wrapper.py", "1", "--port", str(_free_port()), "--retitle"])).leg_dir)
    assert "errors" not in meta, meta.get("errors")
    [child] = [r for r in meta["resolved_config"]["server"]["environ_read"] if r["role"] == "server child"]
    assert child["environ"].startswith("unreadable") and "overwritten" in child["environ"]
    assert "VLLM_BATCH_INVARIANT" not in child
    # negative control: the same child, not retitled, is read
    honest = _honest(box, server_cmd=[PY, "wrapper.py", "1", "--port", str(_free_port())])
    assert ("server child", "1") in _bi(honest["resolved_config"]["server"]["environ_read"])


def test_a_command_that_execs_with_the_other_arm_is_an_error(box):
    spec = _clean_exit_spec(box, command=["env", "VLLM_BATCH_INVARIANT=0", PY, "graceful.py", "0.5"], server_cmd=None)
    meta = _meta(leg_run.run_leg(spec).leg_dir)
    assert ("command", "0") in _bi(meta["resolved_config"]["command_environ"])
    assert any("command pid" in e and "VLLM_BATCH_INVARIANT=0" in e and "bi1" in e for e in meta["errors"])
    honest = _honest(box, command=[PY, "graceful.py", "0.5"], server_cmd=None)
    assert set(_bi(honest["resolved_config"]["command_environ"])) == {("command", "1")}


def test_a_command_child_of_the_other_arm_is_an_error(box):
    child = ("import os, subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(1)'], "
             "env={**os.environ, 'VLLM_BATCH_INVARIANT': sys.argv[1]})")
    meta = _meta(leg_run.run_leg(_clean_exit_spec(box, command=[PY, "-c", child, "0"], server_cmd=None)).leg_dir)
    assert any("command child pid" in e and "VLLM_BATCH_INVARIANT=0" in e for e in meta["errors"])
    honest = _honest(box, command=[PY, "-c", child, "1"], server_cmd=None)
    assert ("command child", "1") in _bi(honest["resolved_config"]["command_environ"])


def _running(box: Path, env: dict[str, str | None]):
    import subprocess

    full = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    return subprocess.Popen([PY, "-c", "import time; time.sleep(30)"], env=full, cwd=box)


def _unreadable_for(monkeypatch, pid: int) -> None:
    real = leg_run.read_environ
    monkeypatch.setattr(leg_run, "read_environ",
                        lambda p: (None, f"/proc/{p}/environ: PermissionError: denied") if p == pid else real(p))


@pytest.mark.serial  # 0.3 s for the server to exec
@pytest.mark.parametrize("item", ["throughput", "clean_exit"])
def test_a_running_server_whose_environment_cannot_be_read_is_not_a_verified_arm(box, monkeypatch, item):
    server = _running(box, {"VLLM_BATCH_INVARIANT": "0"})
    try:
        time.sleep(0.3)
        _unreadable_for(monkeypatch, server.pid)
        spec = leg_run.LegRunSpec(out=box / "leg", item=item, arm="bi0", cwd=box, server_pid=server.pid,
                                  command=[PY, "-c", "pass"])
        meta = _meta(leg_run.run_leg(spec).leg_dir)  # not refused, not skipped: recorded unknown
        monkeypatch.undo()
        honest = _meta(leg_run.run_leg(leg_run.LegRunSpec(out=box / "honest", item=item, arm="bi0", cwd=box,
                                                          server_pid=server.pid, command=[PY, "-c", "pass"])).leg_dir)
    finally:
        server.kill()
        server.wait()
    [root] = meta["resolved_config"]["server"]["environ_read"]
    assert root["environ"].startswith("unreadable") and "env" not in meta["resolved_config"]["server"]
    unread = [e for e in meta.get("errors", ()) if e.startswith("the server's environment could not be read")]
    assert len(unread) == (1 if item == "throughput" else 0)  # the server of a throughput/quality leg
    assert not any("could not be read" in e for e in honest.get("errors", ()))
    assert _bi(honest["resolved_config"]["server"]["environ_read"]) == [("server", "0")]


@pytest.mark.serial  # 0.3 s for the servers to exec
def test_a_running_server_without_the_switch_is_an_error_not_read_as_off(box):
    server = _running(box, {"VLLM_BATCH_INVARIANT": None})
    control = _running(box, {"VLLM_BATCH_INVARIANT": "0"})
    try:
        time.sleep(0.3)
        metas = {name: _meta(leg_run.run_leg(leg_run.LegRunSpec(out=box / name, item="clean_exit", arm="bi0", cwd=box,
                                                                server_pid=p.pid, command=[PY, "-c", "pass"])).leg_dir)
                 for name, p in (("unset", server), ("honest", control))}
    finally:
        for p in (server, control):
            p.kill()
            p.wait()
    assert any("VLLM_BATCH_INVARIANT=(unset)" in e for e in metas["unset"]["errors"])
    assert not any("VLLM_BATCH_INVARIANT" in e for e in metas["honest"].get("errors", ()))


# ------------------------------------------------------------------ F5: --metadata labels are not the workload

FAKE_VLLM = textwrap.dedent("""
    # `vllm bench serve --save-result`: the result JSON as vLLM writes it (num_prompts, then the
    # --metadata pairs over it, then its own numbers)
    import json, sys
    a = sys.argv[3:]
    n = int(a[a.index("--num-prompts") + 1]) if "--num-prompts" in a else 1000
    res = {"num_prompts": n}
    if "--metadata" in a:
        for kv in a[a.index("--metadata") + 1:]:
            if kv.startswith("--"):
                break
            k, v = kv.split("=", 1)
            res[k] = v
    res.update({"max_concurrency": 1, "duration": 1.0, "completed": n, "failed": 0, "total_input_tokens": 8 * n,
                "total_output_tokens": 4 * n, "request_throughput": n / 1.0, "output_throughput": 4.0 * n,
                "total_token_throughput": 12.0 * n})
    json.dump(res, open(a[a.index("--result-filename") + 1], "w"))
""")


def _bench_leg(box: Path, name: str, *flags: str):
    vllm = box / "bin" / "vllm"
    if not vllm.exists():
        vllm.parent.mkdir(exist_ok=True)
        vllm.write_text(f"#!{PY}\n" + FAKE_VLLM)
        vllm.chmod(0o755)
    command = [str(vllm), "bench", "serve", "--dataset-name", "random", "--random-input-len", "8",
               "--random-output-len", "4", "--max-concurrency", "1", "--num-prompts", "2", "--save-result",
               "--result-filename", f"{name}.json", *flags]
    meta = _meta(leg_run.run_leg(leg_run.LegRunSpec(out=box / name, item="throughput", arm="bi0", round=1, slot=1,
                                                    cwd=box, command=command)).leg_dir)
    return meta, load_bench_leg(box / name)


def test_a_metadata_label_no_flag_supports_is_an_error_and_never_the_workload(box):
    meta, leg = _bench_leg(box, "labels", "--metadata", "ignore_eos=true", "num_warmups=1")
    assert leg.bench.ignore_eos is True and leg.bench.num_warmups == 1  # the labels are in the result JSON
    assert leg.workload("ignore_eos") is None and leg.workload("num_warmups") is None  # ... but not the workload
    rc = meta["resolved_config"]
    assert "ignore_eos" in rc and rc["ignore_eos"] is None and rc["num_warmups"] is None
    assert {e.split(":")[0] for e in meta["errors"]} == {"--metadata ignore_eos=true", "--metadata num_warmups=1"}
    # negative control: the flags themselves state them; a label that agrees is no error
    meta, leg = _bench_leg(box, "flags", "--ignore-eos", "--num-warmups", "1", "--metadata", "num_warmups=1")
    assert "errors" not in meta, meta.get("errors")
    assert (leg.workload("ignore_eos"), leg.workload("num_warmups"), leg.workload("input_len")) == (True, 1, 8)


def test_a_metadata_label_the_flags_contradict_is_an_error_and_the_flag_is_recorded(box):
    meta, leg = _bench_leg(box, "contradicted", "--num-warmups", "2", "--metadata", "num_warmups=1")
    assert leg.workload("num_warmups") == 2 and meta["resolved_config"]["num_warmups"] == 2
    assert any(e.startswith("--metadata num_warmups=1 contradicts") for e in meta["errors"])
    meta, _ = _bench_leg(box, "agrees", "--num-warmups", "2", "--metadata", "num_warmups=2")
    assert "errors" not in meta, meta.get("errors")


def test_a_num_prompts_label_vllm_wrote_over_its_own_is_unknown(box):
    meta, _ = _bench_leg(box, "label", "--metadata", "num_prompts=2")
    assert meta["resolved_config"]["num_prompts"] == 2  # the flag states it: the label agrees
    assert "errors" not in meta, meta.get("errors")
    vllm = box / "bin" / "vllm"
    command = [str(vllm), "bench", "serve", "--random-input-len", "8", "--random-output-len", "4", "--save-result",
               "--result-filename", "n.json", "--metadata", "num_prompts=2"]
    meta = _meta(leg_run.run_leg(leg_run.LegRunSpec(out=box / "n", item="throughput", arm="bi0", round=1, slot=1,
                                                    cwd=box, command=command)).leg_dir)
    assert meta["resolved_config"]["num_prompts"] is None  # not copied back from the result JSON
    assert any(e.startswith("--metadata num_prompts=2: no flag") for e in meta["errors"])


# ------------------------------------------------------------------ F6: a client leg's versions are its server's


def _other_python(box: Path) -> Path:
    """An interpreter that sees no installed distribution (the venv's Python, isolated, no site)."""
    py = box / "otherpy" / "python3"
    py.parent.mkdir(exist_ok=True)
    py.write_text(f"#!/bin/sh\nexec {PY} -I -S \"$@\"\n")
    py.chmod(0o755)
    return py


def test_a_client_legs_versions_are_the_servers_interpreters(box):
    port = _free_port()
    spec = _bench_spec(box, "bi1", out="other", server_cmd=[str(_other_python(box)), "server.py", "--port", str(port)],
                       server_timeout=30)
    meta = _meta(leg_run.run_leg(spec).leg_dir)
    rc = meta["resolved_config"]
    assert meta["versions"]["vllm"] is None and meta["versions"]["torch"] is None  # the server has neither
    assert rc["client_versions"]["vllm"] and rc["client_versions"]["torch"]  # the bench client has both
    assert meta["versions"] == rc["server"]["versions"] and "server's interpreter" in rc["versions_from"]
    # negative control: a server in the command's own interpreter records the same versions
    spec = _bench_spec(box, "bi1", out="same", server_cmd=_server(_free_port()), server_timeout=30)
    meta = _meta(leg_run.run_leg(spec).leg_dir)
    assert "errors" not in meta, meta.get("errors")
    assert meta["versions"]["vllm"] and meta["versions"] == meta["resolved_config"]["client_versions"]


def test_a_client_leg_whose_servers_versions_are_unknown_records_no_vllm_or_torch(box):
    port = _free_port()
    spec = _bench_spec(box, "bi1", server_cmd=["sh", "-c", f"exec {PY} server.py --port {port}"],
                       server_url=f"http://127.0.0.1:{port}", server_timeout=30)
    meta = _meta(leg_run.run_leg(spec).leg_dir)
    assert "vllm" not in meta["versions"] and "torch" not in meta["versions"]
    assert meta["resolved_config"]["client_versions"]["vllm"]  # kept, under its own name
    assert any(e.startswith("versions: the server's vLLM and torch are unknown") for e in meta["errors"])
    spec = _bench_spec(box, "bi1", out="honest", server_cmd=_server(_free_port()), server_timeout=30)
    assert "errors" not in _meta(leg_run.run_leg(spec).leg_dir)


# ------------------------------------------------------------------ F7: the device the command sees


def test_the_device_count_is_what_the_commands_cuda_visible_devices_names(box, monkeypatch):
    smi = box / "bin" / "nvidia-smi"
    smi.parent.mkdir(exist_ok=True)
    smi.write_text("#!/bin/sh\necho '0, GPU-aaa, NVIDIA H200, 570.1, 143771 MiB, 9.0'\n"
                   "echo '1, GPU-bbb, NVIDIA H200, 570.1, 143771 MiB, 9.0'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def device(out: str, env: dict) -> dict:
        spec = leg_run.LegRunSpec(out=box / out, item="forward", arm="bi1", cwd=box, command=[PY, "-c", "pass"], env=env)
        return _meta(leg_run.run_leg(spec).leg_dir)["device"]

    assert device("one", {"CUDA_VISIBLE_DEVICES": "1"})["count"] == 1
    assert device("both", {})["count"] == 2  # negative control: nothing hidden, both GPUs


# ------------------------------------------------------------------ F8: --collect takes only this run's bytes


def _row(step: int) -> str:
    return json.dumps({"step": step, "training/rollout_probs_diff_max": 0.0, "training/rollout_probs_diff_mean": 0.0}) + "\n"


def _forward_leg(box: Path, out: str, code: str) -> dict:
    (box / f"{out}.py").write_text(code)
    spec = leg_run.LegRunSpec(out=box / out, item="forward", arm="bi1", cwd=box, trainer="external",
                              command=[PY, f"{out}.py"], collect=[f"metrics.jsonl={out}.jsonl"])
    return _meta(leg_run.run_leg(spec).leg_dir)


def _steps(leg: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (leg / "metrics.jsonl").read_text().splitlines()]


def test_collect_takes_only_what_the_command_appended_to_a_file_from_before(box):
    (box / "append.jsonl").write_text(_row(1) + _row(2) + _row(3))  # another run's steps
    meta = _forward_leg(box, "append", f"open('append.jsonl', 'a').write({_row(4) + _row(5)!r})")
    assert _steps(box / "append") == [4, 5]
    assert meta["resolved_config"]["collected_from_byte"] == {"metrics.jsonl": len(_row(1) + _row(2) + _row(3))}
    assert "errors" not in meta, meta.get("errors")
    # negative control: a file the command created is collected whole, from byte 0
    meta = _forward_leg(box, "fresh", f"open('fresh.jsonl', 'w').write({_row(1) + _row(2)!r})")
    assert _steps(box / "fresh") == [1, 2] and "collected_from_byte" not in meta["resolved_config"]
    assert "errors" not in meta, meta.get("errors")


def test_collect_refuses_a_file_from_before_that_the_command_rewrote(box):
    earlier = _row(1) + _row(2)
    (box / "rewrite.jsonl").write_text(earlier)
    meta = _forward_leg(box, "rewrite", f"open('rewrite.jsonl', 'w').write({_row(7) + _row(1) + _row(2) + _row(3)!r})")
    assert not (box / "rewrite" / "metrics.jsonl").exists()  # never sealed as this leg's
    assert any(f"held {len(earlier)} bytes from before the run" in e for e in meta["errors"])
    meta = _forward_leg(box, "fresh", f"open('fresh.jsonl', 'w').write({_row(1)!r})")
    assert _steps(box / "fresh") == [1] and "errors" not in meta


# ------------------------------------------------------------------ S2: exit lines are whole lines, and vLLM's word of a death wins

ENGINE = 4_190_111  # no process holds it: the records read the log


def _exit_line(code: int = 0) -> str:
    return f"TICA_PROC_EXIT role=engine_core name=EngineCore_DP0 pid={ENGINE} exitcode={code} grace_s=30"


def test_an_exit_marker_inside_a_logged_prompt_is_not_an_exit(box):
    forged = box / "forged.txt"
    forged.write_text("(APIServer pid={pid}) INFO Received request cmpl-1: prompt: 'x " + _exit_line() + "'\n")
    meta = _meta(leg_run.run_leg(_clean_exit_spec(box, server_cmd=_server(_free_port(), "--on-term", str(forged))))
                 .leg_dir)
    assert "engine_core" not in _roles(meta)  # nothing reported it: unknown, never exited 0
    # negative control: the marker on its own line, after vLLM's process prefix, is the engine's exit
    honest = box / "honest.txt"
    honest.write_text("(APIServer pid={pid}) " + _exit_line() + "\n")
    meta = _honest(box, server_cmd=_server(_free_port(), "--on-term", str(honest)))
    engine = _roles(meta)["engine_core"]
    assert (engine["pid"], engine["end_state"], engine["exit_code"]) == (ENGINE, "exited", 0)


@pytest.mark.parametrize("line", [
    "ERROR 12-01 10:00:00 [utils.py:593] Engine core process EngineCore_DP0 died unexpectedly.",
    f"WARNING [utils.py:654] [shutdown] Process manager: force killing remaining process EngineCore_DP0 pid {ENGINE}",
    f"WARNING [system_utils.py:226] [shutdown] force killing sub process EngineCore_DP0 pid {ENGINE}",
])
def test_vllms_word_that_the_engine_died_outweighs_a_reported_exit_0(line):
    def engine(log: str) -> dict:
        recs, _ = leg_run.engine_records(log, engine_pids=[ENGINE], worker_pids=[], names={ENGINE: "VLLM::EngineCor"},
                                         alive={ENGINE: False})
        [rec] = [r for r in recs if r["pid"] == ENGINE]
        return rec

    died = engine(f"(APIServer pid=10) {_exit_line()}\n{line}\n")
    assert exit_problem(ProcessExit.model_validate(died)) is not None
    clean = engine(f"\x1b[1;36m(APIServer pid=10)\x1b[0;0m {_exit_line()}\n")  # negative control (coloured prefix)
    assert (clean["end_state"], clean["exit_code"]) == ("exited", 0)
    assert exit_problem(ProcessExit.model_validate(clean)) is None


def test_the_cli_exits_1_for_a_leg_it_had_to_stop(box):
    args = ["run", "--item", "forward", "--arm", "bi1", "--cwd", str(box)]
    assert leg_run_cli.main([*args, "--out", str(box / "t"), "--timeout", "1", "--", PY, "graceful.py", "60"]) == 1
    assert leg_run_cli.main([*args, "--out", str(box / "ok"), "--", PY, "graceful.py", "0.1"]) == 0


def test_a_collected_folder_is_never_merged_into_the_legs_root():
    """`--collect .=DIR` would put DIR's seal.json or leg.json on the names the leg itself writes."""
    from tica.leg_run import LegRunError, check_leg_name

    for name in (".", "./", "leg.json", "seal.json"):
        with pytest.raises(LegRunError):
            check_leg_name(name)
    assert check_leg_name("out/seal.json") == "out/seal.json"  # control: deeper down it is the leg's content


def _fake_proc(tmp_path: Path, environ: bytes, cmdline: bytes) -> Path:
    d = tmp_path / "proc" / str(os.getpid())  # a live pid, so the empty environ is not an exit
    d.mkdir(parents=True)
    (d / "environ").write_bytes(environ)
    (d / "cmdline").write_bytes(cmdline)
    return tmp_path / "proc"


def test_a_process_read_while_still_in_exec_is_unknown_not_a_process_without_the_switch(tmp_path):
    """Popen returns when exec closes its close-on-exec pipe, before the kernel writes the new
    stack: a reading then finds environ and cmdline empty. That is not "ran with the switch
    unset" (a loaded CI host flagged an honest leg so); it is not readable yet."""
    env, why = leg_run.read_environ(os.getpid(), _fake_proc(tmp_path, b"", b""))
    assert env is None and "still in exec" in why


def test_an_environ_the_kernel_fills_a_moment_after_the_cmdline_is_read_not_taken_for_empty(tmp_path):
    """Exec publishes cmdline a moment before environ (CI read an honest bi1 command as "switch
    unset" in that moment): an empty environ beside a cmdline is read again until it settles."""
    import threading

    proc = _fake_proc(tmp_path, b"", b"python\0graceful.py\0")
    late = threading.Timer(0.05, (proc / str(os.getpid()) / "environ").write_bytes,
                           [b"VLLM_BATCH_INVARIANT=1\0PATH=/bin\0"])
    late.start()
    env, why = leg_run.read_environ(os.getpid(), proc)
    late.join()
    assert env == {"VLLM_BATCH_INVARIANT": "1", "PATH": "/bin"} and why == ""


def test_a_process_execd_with_no_environment_is_read_as_such_and_is_an_error(tmp_path):
    """The negative control: `env -i cmd` leaves a cmdline and an empty environ: read, switch
    unset, and the leg's environ check names it."""
    env, why = leg_run.read_environ(os.getpid(), _fake_proc(tmp_path, b"", b"python\0graceful.py\0"))
    assert env == {} and why == ""
    rec = {"pid": 1, "role": "command", "name": "python", "environ": "read", leg_run.SWITCH: env.get(leg_run.SWITCH)}
    assert leg_run.environ_problems([rec], "bi1")


# ------------------------------------------------------------------ the stop signals reach the command
_PROBE = [PY, "-c", "print(open('/proc/self/status').read())"]
_STOP_BITS = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))


def _inherited(status: str) -> tuple[int, int]:
    """(ignored, blocked) of SIGINT and SIGTERM in a child's /proc status."""
    masks = dict(line.split(":", 1) for line in status.splitlines() if line.startswith(("SigIgn", "SigBlk")))
    return int(masks["SigIgn"], 16) & _STOP_BITS, int(masks["SigBlk"], 16) & _STOP_BITS


@pytest.fixture
def stop_signals_ignored():
    """This process as Dagster's capture_interrupts leaves one started with SIGINT ignored (SIGTERM
    mapped to SIG_IGN), with SIGINT and SIGTERM blocked in this thread besides."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, signal.SIG_IGN)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    for s, handler in previous.items():
        signal.signal(s, handler)


def test_a_command_stops_at_its_timeout_when_tica_itself_ignores_sigterm(work, stop_signals_ignored):
    import subprocess

    from tica.legs import common

    # negative control: a child started plainly inherits both, and would shrug off its SIGTERM
    assert _inherited(subprocess.run(_PROBE, capture_output=True, text=True).stdout) == (_STOP_BITS, _STOP_BITS)
    assert common.stop_signals_inherited()
    assert _inherited(subprocess.run(_PROBE, capture_output=True, text=True,
                                     preexec_fn=common.stoppable()).stdout) == (0, 0)
    spec = leg_run.LegRunSpec(out=work / "leg", item="forward", arm="bi1", cwd=work, timeout=1,
                              command=[PY, "-c", "import time; time.sleep(60)"])
    [trainer] = _meta(leg_run.run_leg(spec).leg_dir)["processes"]
    # ended by the first SIGTERM, not by the SIGKILL sent 30 s after a SIGTERM that did nothing
    assert (trainer["end_state"], trainer["signal"]) == ("signalled", signal.SIGTERM.value)


def test_a_child_needs_no_reset_when_nothing_is_ignored_or_blocked():
    from tica.legs import common

    if common.stop_signals_inherited():
        pytest.skip("this test process was started with SIGINT or SIGTERM ignored or blocked")
    assert common.stoppable() is None  # the plain spawn, no preexec_fn
    marker = []
    assert common.stoppable(lambda: marker.append(1)) is not None


def test_a_process_is_the_same_process_after_the_wall_clock_steps(monkeypatch):
    """Start ticks since boot identify a process, not a wall-clock create time: psutil's create_time
    adds a boot time it re-reads from the clock each call, so a clock step (chrony on a fresh host,
    a VM resumed) would make a live server or a watched command look like another process."""
    import psutil
    from psutil import _pslinux  # where psutil reads the boot time on Linux

    me = os.getpid()
    ticks, wall = leg_run.process_start_ticks(me), psutil.Process(me).create_time()
    stepped = _pslinux.boot_time() + 3600.0
    monkeypatch.setattr(_pslinux, "boot_time", lambda: stepped)
    assert ticks is not None and leg_run.process_start_ticks(me) == ticks
    # the control: the same step moves the wall-clock create time
    assert psutil.Process(me).create_time() != wall


def test_a_server_pid_no_process_can_have_is_refused_by_name(tmp_path):
    with pytest.raises(leg_run.LegRunError, match="no running process -1"):
        leg_run.RunningServer(-1, None)
