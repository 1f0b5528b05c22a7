"""Clean exit's canaries: a passing receipt set (every role of both arms exited 0) and one planted
error per rule, each of which the judge must not pass. `tica.canaries` runs them with every
other item's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tica.canary_legs import FAIL, INCONCLUSIVE, Canary, edit_meta, leg_meta, load_json, proc, write_leg
from tica.evidence import EvidenceItem
from tica.items.clean_exit.criteria import CleanExitCriteria
from tica.question import Question

E = EvidenceItem

# The question the built-in canaries and the committed fixtures are judged under.
QUESTION: dict[str, Any] = {
    "name": "clean-exit", "compared": "exit code and end state of every process",
    "computation": "leg receipts", "pass_line": "every process exited 0", "criteria": {"item": "clean_exit"}}


def build_clean_exit(question: Question, dest: Path) -> list[Path]:
    c: CleanExitCriteria = question.criteria  # type: ignore[assignment]
    legs = []
    for i, arm in enumerate(("bi1", "bi0")):
        roles = list(dict.fromkeys([*c.required_roles, "client", "api_server", "engine_core", "worker"]))
        procs = [proc(role, 9000 + 10 * i + k) for k, role in enumerate(roles)]
        legs.append(write_leg(dest / f"exit_{arm}", leg_meta("clean_exit", arm, processes=procs), {}))
    return legs


def process_exit(role: str, **kv: Any) -> Callable[[Question, list[Path]], None]:
    """The first leg's first `role` process recorded with `kv` (an exit code, end state, signal...)."""
    def mutate(q: Question, legs: list[Path]) -> None:
        leg = legs[0]
        def f(m: dict[str, Any]) -> None:
            for p in m["processes"]:
                if p["role"] == role:
                    p.update(kv)
                    return
        edit_meta(leg, f)
    return mutate


def arm_roles_missing(q: Question, legs: list[Path]) -> None:
    """One arm's legs record no EngineCore exit (as a lost or killed engine leaves them)."""
    arm = load_json(legs[0] / "leg.json")["arm"]
    for leg in legs:
        if load_json(leg / "leg.json")["arm"] == arm:
            edit_meta(leg, lambda m: m.update(processes=[p for p in m["processes"] if p["role"] != "engine_core"]))


# The must_record canary every item has is tica.canaries' (it reads the question, not the item).
CANARIES: tuple[Canary, ...] = (
    Canary("clean_exit.force_killed", E.CLEAN_EXIT, "vLLM's force kill of EngineCore is not clean", FAIL,
           process_exit("engine_core", evidence="Force killing remaining process EngineCore (pid 9002)")),
    Canary("clean_exit.client", E.CLEAN_EXIT, "the client exits normally", FAIL, process_exit("client", exit_code=1)),
    Canary("clean_exit.worker", E.CLEAN_EXIT, "every worker ends normally", FAIL,
           process_exit("worker", end_state="signalled", exit_code=None, signal="SIGKILL")),
    Canary("clean_exit.api_server", E.CLEAN_EXIT, "the API server ends", FAIL,
           process_exit("api_server", end_state="running", exit_code=None)),
    Canary("clean_exit.each_arm", E.CLEAN_EXIT, "each arm's exits verified on its own: the other's never cover it",
           INCONCLUSIVE, arm_roles_missing),
)
