"""Whether one recorded process ended normally: the exit rule every leg's `processes` are read
by. Clean exit judges it over every leg it covers (tica/items/clean_exit/judge.py); throughput
reads it first, before any number of a leg counts (tica/items/throughput/judge.py); the leg runner's
tests check what it records against it.

vLLM force-kills its EngineCore at once when its shutdown timeout (`--shutdown-timeout`,
default 0) is 0 (`get_engine_process_shutdown_timeout` in vllm/v1/engine/utils.py, `shutdown` in
vllm/v1/utils.py): a force kill under a recorded timeout of 0 says so in its reason. It is a
failure all the same.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tica.receipts import LegMeta, ProcessExit

SIDES = {"client": "client", "api_server": "server", "engine_core": "server", "worker": "server", "trainer": "trainer",
         "trainer_engine_core": "trainer", "trainer_worker": "trainer"}
# vLLM's shutdown path logs this when a child had to be killed; the exit code alone can hide it.
_FORCED = re.compile(r"force[ _-]?kill", re.IGNORECASE)
_STOPPED_BY_TICA = re.compile(r"tica leg run sent SIG(TERM|KILL|INT) after")
ZERO_TIMEOUT_HINT = ("shutdown timeout 0: vLLM force-kills the EngineCore at once; "
                     "set a positive --shutdown-timeout in the recipe")


def exit_problem(p: ProcessExit) -> str | None:
    """Why a process did not end normally, or None when it did."""
    if p.end_state != "exited":
        sig = f" by signal {p.signal}" if p.signal is not None else ""
        return f"ended {p.end_state}{sig}"
    if p.signal is not None:  # "exited" and a signal: the record contradicts itself
        return f"recorded as exited yet names signal {p.signal}"
    if p.exit_code != 0:
        return f"exit code {p.exit_code}"
    if p.evidence and _FORCED.search(p.evidence):
        return f"force killed: {p.evidence!r}"
    if p.evidence and _STOPPED_BY_TICA.search(p.evidence):  # legs sealed before leg run recorded it as signalled
        return f"stopped by tica leg run, not ended by itself: {p.evidence!r}"
    return None


def force_killed(p: ProcessExit) -> bool:
    return p.end_state == "force_killed" or bool(p.evidence and _FORCED.search(p.evidence))


def recorded_shutdown_timeout(meta: LegMeta) -> int | None:
    """The leg's engine shutdown timeout, seconds: as vLLM logged applying it (kernels.rollout),
    else as the producer passed it (resolved_config). None: not recorded (unknown)."""
    rollout = meta.kernels.get("rollout")
    logged = rollout.get("shutdown_timeout") if isinstance(rollout, dict) else None
    for value in (logged, meta.resolved_config.get("shutdown_timeout")):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def shutdown_note(meta: LegMeta, p: ProcessExit) -> str:
    """Why vLLM force-killed an EngineCore, where the leg's recorded timeout says it: '' otherwise."""
    if p.role != "engine_core" or not force_killed(p):  # the recorded timeout is the rollout engine's
        return ""
    timeout = recorded_shutdown_timeout(meta)
    if timeout == 0:
        return f" ({ZERO_TIMEOUT_HINT})"
    if timeout is not None:
        return f" (despite a shutdown timeout of {timeout} s)"
    return ""


def exit_problems(meta: LegMeta, sides: Sequence[tuple[str, str]] = (("client", "client"), ("server", "api_server"))
                  ) -> list[str]:
    """Why a leg's exits are not clean: a side with no exit receipt (`sides`: side -> the role
    that must be recorded), or any process that did not end normally. Empty: clean."""
    problems = [f"{side} exit not recorded (no {role} process in processes)"
                for side, role in sides if not any(p.role == role for p in meta.processes)]
    problems += [f"{SIDES[p.role]}: {p.role} pid {p.pid} {why}{shutdown_note(meta, p)}"
                 for p in meta.processes if (why := exit_problem(p))]
    return problems

