"""Clean exit's judge: client and server verified separately; every worker, EngineCore and API
server must end normally (one process's rule: tica.process_exits, shared with throughput).
vLLM's "force killing remaining process EngineCore" is not a clean exit.

A process is counted by its content identity (`ProcessExit.identity`: the create time, name and
command line its producer read from the process while it lived), never by its role or pid: exits
that record one identity are one process, so a role "covered" by a copy of another role's exit
(another pid, any label) is not covered, and a role only exits of unknown identity cover cannot
show that it ran as its own process. Neither passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tica.evidence import EvidenceItem
from tica.items.clean_exit.criteria import CleanExitCriteria
from tica.judging import Findings, cell, md_table, shown, wrong_question_cell
from tica.confounders import require_recorded
from tica.messages import clip, unparenthesized
from tica.process_exits import SIDES, exit_problem, shutdown_note
from tica.question import Question
from tica import leg_times
from tica.receipts import Leg, LegMeta, LiveProcess, ProcessExit, load_leg
from tica.verdict import VerdictCell

# psutil reads a process's create time in clock ticks (1/100 s on Linux): two create times closer
# than one tick cannot be told apart.
CREATE_TIME_TICK_S = 0.01
Identity = tuple[float, "str | None", "tuple[str | None, ...] | None"]


def identity_of(p: ProcessExit | LiveProcess) -> Identity | None:
    """The process's content identity: its create time with its name or command line, as its
    producer read them from the process. None: unknown (not recorded, or a create time alone)."""
    i = p.identity
    if i is None or i.create_time is None or (i.name is None and i.cmdline is None):
        return None
    return (i.create_time, i.name, i.cmdline)


def same_process(a: Identity, b: Identity) -> bool:
    """Whether content tells two identities apart: not when their create times lie within one tick
    and no field recorded on both sides differs (a field dropped from a copy makes no new process)."""
    return abs(a[0] - b[0]) < CREATE_TIME_TICK_S and all(x is None or y is None or x == y
                                                         for x, y in zip(a[1:], b[1:]))


def shown_identity(p: ProcessExit) -> str:
    ident = identity_of(p)
    if ident is None:
        return "unknown"
    return ", ".join([f"created {ident[0]:.2f}", *([f"name {ident[1]}"] if ident[1] else []),
                      *([f"command {clip(' '.join(a or '' for a in ident[2]), 60)}"] if ident[2] else [])])


def _ran_as(entries: Sequence[tuple[Leg, ProcessExit]]) -> str:
    return " and ".join(f"{leg.arm} {leg.path.name} {p.role} pid {p.pid}" for leg, p in entries)


def lived_through(leg: Leg, p: ProcessExit, ident: Identity) -> bool:
    """Whether the leg shows that the process of this exit ran through it: the leg read it alive,
    under the same role, pid and identity, once its work had ended, and it was created before the
    work began. Unknown times show nothing."""
    try:
        started, ended = leg_times.parse(leg.meta.started_at), leg_times.parse(leg.meta.ended_at)
    except ValueError:
        return False
    if started is None or ended is None or not started.aware:
        return False
    for live in leg.meta.alive_at_end:
        seen = identity_of(live)
        if live.role != p.role or live.pid != p.pid or seen is None or not same_process(ident, seen):
            continue
        try:
            read = leg_times.parse(live.read_at)
        except ValueError:
            continue
        if read is not None and leg_times.ordered(ended, read) is True \
                and ident[0] <= started.at.timestamp() + CREATE_TIME_TICK_S:
            return True
    return False


def one_process_many_records(legs: Sequence[Leg]) -> list[list[tuple[Leg, ProcessExit]]]:
    """Exits of one identity recorded as more than one process: under two roles or pids, in two
    arms, or in two legs other than one throughput round's (whose legs share one server). Each group
    is one process, however it is labelled: it shows at most one of those roles ran. A process that
    every leg naming it read alive through its work (`lived_through`) served each of them, so its one
    exit stands for all: a server across rounds, a trainer across its legs, one bench client across
    both arms (the client carries no arm's switch; a server or trainer runs under one)."""
    known = [(leg, p, ident) for leg in legs for p in leg.meta.processes if (ident := identity_of(p)) is not None]
    groups: list[list[tuple[Leg, ProcessExit, Identity]]] = []
    for entry in known:
        joined = [g for g in groups if any(same_process(entry[2], other[2]) for other in g)]
        for g in joined:
            groups.remove(g)
        groups.append([x for g in joined for x in g] + [entry])
    out = []
    for g in groups:
        roles = {p.role for _, p, _ in g}
        pids = {p.pid for _, p, _ in g}
        arms = {leg.arm for leg, _, _ in g}
        paths = {leg.path for leg, _, _ in g}
        # one server serves the concurrencies of one round and arm; another round starts its own
        shared = all(leg.meta.item == "throughput" for leg, _, _ in g) and len({leg.meta.round for leg, _, _ in g}) == 1
        served_all = len(roles) == 1 and len(pids) == 1 and (len(arms) == 1 or roles == {"client"}) \
            and all(lived_through(leg, p, ident) for leg, p, ident in g)
        if served_all:
            continue
        if len(roles) > 1 or len(pids) > 1 or len(arms) > 1 or (len(paths) > 1 and not shared):
            out.append(list({(id(leg), id(p)): (leg, p) for leg, p, _ in g}.values()))
    return out


def unknown_roles(leg: Leg) -> list[str]:
    """The roles a leg records whose exits all lack a known identity: nothing shows that they ran
    as processes of their own (copies of another role's exit are caught by one_process_many_records)."""
    return [role for role in dict.fromkeys(p.role for p in leg.meta.processes)
            if all(identity_of(p) is None for p in leg.meta.processes if p.role == role)]


def distinct_workers(leg: Leg) -> int:
    """How many worker processes the leg's worker exits show: exits of one identity count once."""
    seen: list[Identity] = []
    unknown = 0
    for p in leg.meta.processes:
        if p.role != "worker":
            continue
        ident = identity_of(p)
        if ident is None:
            unknown += 1
        elif not any(same_process(ident, s) for s in seen):
            seen.append(ident)
    return len(seen) + unknown


SERVED_ITEMS = ("clean_exit", "throughput")


def served(meta: LegMeta) -> bool:
    """A leg that ran an API server and its client: a clean-exit or throughput leg, or any leg whose
    exits name an API server. Each such leg must record the exits of every required role."""
    return meta.item in SERVED_ITEMS or any(p.role == "api_server" for p in meta.processes)


def world_size(meta: LegMeta) -> int | None:
    """How many GPU workers the leg's server runs (tensor × pipeline parallel), None when unrecorded."""
    sizes = [meta.resolved_config.get(k) for k in ("tensor_parallel_size", "pipeline_parallel_size")]
    if not isinstance(sizes[0], int):
        return None
    return sizes[0] * (sizes[1] if isinstance(sizes[1], int) else 1)


def server_roles(required: Sequence[str], meta: LegMeta, served_legs: Sequence[Any]) -> list[str]:
    """The server roles a served leg must record an exit for: the question's, and every server
    role another served leg of its item recorded (the same recipe runs the same processes, so a
    role one leg shows and another lacks is an exit that leg did not record)."""
    seen = {p.role for leg in served_legs if leg.meta.item == meta.item for p in leg.meta.processes
            if SIDES[p.role] == "server"}
    return list(required) + sorted(seen - set(required))


def judge_clean_exit(question: Question, leg_paths: Sequence[str | Path]) -> VerdictCell:
    item = EvidenceItem.CLEAN_EXIT
    if (wrong := wrong_question_cell(item, question)) is not None:
        return wrong
    findings = Findings()
    criteria: CleanExitCriteria = question.criteria  # type: ignore[assignment]
    legs = [load_leg(p) for p in leg_paths]
    rows: list[list[Any]] = []
    identities: list[str] = []  # per row: the process's identity as shown (shown_identity)
    ran_rows = 0  # exits of legs that ran: a leg that did not run is no evidence of a clean exit
    sides: dict[str, Findings] = {"client": Findings(), "server": Findings(), "trainer": Findings()}
    seen_roles: dict[str, set[str]] = {}  # arm -> roles whose exits its legs recorded
    for leg in legs:
        name = f"{leg.meta.item} {leg.arm} {leg.path.name}"
        if leg.meta.not_run_reason:
            # "did not run" excuses having no exits; an exit it did record is judged like any other
            findings.note(f"{name}: did not run ({unparenthesized(shown(leg.meta.not_run_reason))})"
                          + ("" if leg.meta.processes else "; no exits to verify"))
            if not leg.meta.processes:
                continue
        elif not leg.meta.processes:
            findings.inconclusive(f"{name}: no exit receipt (processes is empty)")
            continue
        else:
            require_recorded(findings, question, [(name, leg.meta)])
            seen_roles.setdefault(leg.arm, set())
        for p in leg.meta.processes:
            side = SIDES[p.role]
            if not leg.meta.not_run_reason:
                seen_roles[leg.arm].add(p.role)
            problem = exit_problem(p)
            if problem:
                sides[side].fail(f"{name}: {p.role} pid {p.pid} {problem}{shutdown_note(leg.meta, p)}")
            rows.append([name, side, p.role, p.pid, p.end_state, p.exit_code, p.signal, p.evidence,
                         "clean" if problem is None else "NOT clean"])
            identities.append(shown_identity(p))
            ran_rows += not leg.meta.not_run_reason
    for side, f in sides.items():
        findings.extend(f, prefix=f"{side}: ")
    ran = [leg for leg in legs if not leg.meta.not_run_reason and leg.meta.processes]
    copied = one_process_many_records(ran)
    for group in copied:  # one process, however many roles, pids or legs its copies name
        roles = "/".join(dict.fromkeys(p.role for _, p in group))
        pids = ", ".join(dict.fromkeys(str(p.pid) for _, p in group))
        findings.inconclusive(f"one {roles} process (pid {pids}) is recorded {len(group)} times, so it shows at most one "
                              f"of them ended (by content: the same create time, name and command line; {_ran_as(group)})")
    for leg in ran:  # a role counts only by an exit of its own process, known by content
        unknown = unknown_roles(leg)
        if unknown:
            findings.inconclusive(f"{leg.meta.item} {leg.arm} {leg.path.name}: the exits of roles {unknown} record no "
                                  "process identity, a create time with a name or command line read from the "
                                  "process, so they cannot show that each ran as its own process")
    ran_served = [leg for leg in legs if not leg.meta.not_run_reason and served(leg.meta)]
    for leg in ran_served:  # a per-leg rule: a served leg's exits are its own, never another leg's of its arm
        missing = [r for r in server_roles(criteria.required_roles, leg.meta, ran_served)
                   if not any(p.role == r for p in leg.meta.processes)]
        if missing:
            findings.inconclusive(f"{leg.meta.item} {leg.arm} {leg.path.name}: no exit receipt for roles {missing} of "
                                  "the server it ran: they cannot be verified")
        workers = world_size(leg.meta)
        recorded = distinct_workers(leg)
        if workers is not None and workers > 1 and recorded < workers:
            findings.inconclusive(f"{leg.meta.item} {leg.arm} {leg.path.name}: {recorded} worker exit(s) recorded for a "
                                  f"server of {workers} GPU workers: the others cannot be verified")
    for arm, roles in sorted(seen_roles.items()):  # each arm verified on its own: one's exits never cover another's
        missing = [r for r in criteria.required_roles if r not in roles]
        if missing:
            findings.inconclusive(f"{arm}: no exit receipt for roles {missing}: they cannot be verified")
    if not legs:
        findings.not_run("no legs to read exits from")
    elif not ran_rows:
        findings.not_run("no process exit was verified: no leg that ran recorded one")
    numbers = {
        side: {"verdict": f.verdict.value if any(SIDES[r[2]] == side for r in rows) else "not run",
               "processes": sum(1 for r in rows if r[1] == side)}
        for side, f in sides.items()
    }
    numbers["processes"] = [dict(zip(["leg", "side", "role", "pid", "end_state", "exit_code", "signal", "evidence",
                                      "status"], r)) for r in rows]
    numbers["process_identities"] = identities  # per row of `processes`: what content names the process
    tables = {"per process": md_table(["leg", "side", "role", "pid", "end state", "exit code", "signal", "evidence",
                                       "status"], rows)}
    numbers["arms_verified"] = sorted(seen_roles)
    summary = ", ".join(f"{side} {numbers[side]['verdict']} ({numbers[side]['processes']} processes)"
                        for side in ("client", "server", "trainer")) + f"; arms whose legs ran: {sorted(seen_roles) or 'none'}"
    return cell(item, question, findings, summary, numbers, tables, {str(l.path): l.digest for l in legs})
