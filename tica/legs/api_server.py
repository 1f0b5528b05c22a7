"""`python -m tica.legs.api_server ARGS...` runs vLLM's OpenAI API server
(`vllm.entrypoints.openai.api_server`, unchanged) and observes one thing more: after vLLM's own
process-manager shutdown it prints each engine process's exit code,

    TICA_PROC_EXIT name=EngineCore pid=123 exitcode=0

because the EngineCore is the API server's child, and its exit code is otherwise invisible to
the producer. vLLM's behaviour (SIGTERM, grace period, force kill) is not changed.
"""

from __future__ import annotations

import runpy
import sys


def _install_observer() -> None:
    import vllm.v1.engine.utils as engine_utils
    import vllm.v1.utils as v1_utils

    original = v1_utils.shutdown

    def observed_shutdown(procs, timeout=None):
        try:
            original(procs, timeout=timeout)
        finally:
            for p in procs:
                try:
                    p.join(timeout=2)  # reap after vLLM's own terminate/kill
                except Exception:
                    pass
                print(f"TICA_PROC_EXIT name={p.name} pid={p.pid} exitcode={p.exitcode}", flush=True)

    v1_utils.shutdown = observed_shutdown
    engine_utils.shutdown = observed_shutdown


if __name__ == "__main__":
    _install_observer()
    sys.argv = ["vllm.entrypoints.openai.api_server", *sys.argv[1:]]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
