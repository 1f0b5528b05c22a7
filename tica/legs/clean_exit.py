"""Clean-exit leg: one API server and one client, both stopped the ordinary way, and every
process's end recorded on its own: client, API server, EngineCore, workers (with vLLM's own
"force killing" lines, which are not a clean exit). The server gets the recipe's
`--shutdown-timeout` (default `common.SHUTDOWN_TIMEOUT_S`; 0 is vLLM's own default, under which
vLLM force-kills its EngineCore at once), recorded as `resolved_config.shutdown_timeout`, and
vLLM's own log of applying it as `kernels.rollout.shutdown_timeout`.

    python -m tica.legs.clean_exit --out LEG_DIR --arm bi0 --model MODEL_DIR [--shutdown-timeout S]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from tica.legs import common
from tica.legs.throughput import Server, add_server_args, free_port, resolved_workload, run_client


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_args(ap)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--num-prompts", type=int, default=2)
    ap.add_argument("--num-warmups", type=int, default=0)
    ap.add_argument("--fault", choices=("kill-engine-core",), default=None, help="planted fault (canaries/tests only)")
    args = ap.parse_args(argv)
    common.set_arm_env(args.arm)
    common.grant_worker_shutdown(args.shutdown_timeout)
    with common.pipes_context() as pipes:
        leg = common.Leg(args.out, item="clean_exit", arm=args.arm, producer="tica.legs.clean_exit", tee_log=False)
        from tica.models.hashing import weights_hash

        weights = weights_hash(args.model)
        if args.arm == "bi1" and not args.bi1_attempt_engine:
            from tica.legs import engine

            checked_at = common.now()
            reason = engine.bi1_unsupported_reason()
            if reason is not None:
                leg.begin(checked_at)  # the only work: asking vLLM whether it can run BI=1 here
                leg.end()
                leg.finish(not_run_reason=reason)
                return 0
        model = str(Path(args.model).resolve())
        leg.begin()  # the leg's work: the server's start, one client, the server's stop
        server = Server(model, leg.dir / "server.log", port=args.port or free_port(), max_model_len=args.max_model_len,
                        gpu_memory_utilization=args.gpu_memory_utilization, seed=args.seed,
                        shutdown_timeout=args.shutdown_timeout)
        client = None
        try:
            server.wait_healthy(args.server_timeout)
            if args.fault == "kill-engine-core":
                for pid in server.engine_pids:
                    os.kill(pid, signal.SIGKILL)
                leg.meta.setdefault("resolved_config", {})["planted_faults"] = [f"kill-engine-core: SIGKILL to EngineCore {server.engine_pids}"]
                time.sleep(2)
            client = run_client(leg.dir, server, model, concurrency=1, num_prompts=args.num_prompts,
                                num_warmups=args.num_warmups, input_len=args.input_len, output_len=args.output_len,
                                seed=args.seed, metadata={"arm": args.arm, "purpose": "clean_exit"})
        finally:
            server.stop()
            leg.end()
        leg.processes.append(client.record if client else common.process_record("client", None, None, evidence="client never started"))
        leg.processes.extend(server.records())
        planted = leg.meta.get("resolved_config", {}).get("planted_faults")
        leg.meta["resolved_config"] = resolved_workload(args, 1, args.num_prompts, server, weights)
        if planted:
            leg.meta["resolved_config"]["planted_faults"] = planted
        cleanup = server.reap_leftovers()
        if cleanup:
            leg.meta["resolved_config"]["producer_cleanup"] = cleanup
        from tica.legs.engine import served_engine_kernels

        server_log = leg.dir / "server.log"
        leg.meta["kernels"] = {"rollout": served_engine_kernels(server_log.read_text(errors="replace")
                                                                if server_log.is_file() else "")}
        leg.finish()
        states = {p["role"] + (f":{p['pid']}" if p["pid"] else ""): p["end_state"] for p in leg.processes}
        pipes.log.info(f"clean_exit {args.arm}: {states}")
        pipes.report_custom_message({"leg_dir": str(leg.dir), "item": "clean_exit", "processes": leg.processes})
    return 0


if __name__ == "__main__":
    sys.exit(main())
