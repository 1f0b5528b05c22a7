"""Throughput pairing over `vllm bench serve --save-result` JSON, one file per leg.

Order of work, as the practice prescribes: exit and workload receipts first (a leg whose client
or server did not exit cleanly, or whose exits a leg directory does not record, or whose
workload mismatches, is invalid: its round never enters a loss; a workload field it does not
record is unknown, listed, and leaves its target c inconclusive only where the question requires
it, `required_workload`); the crossed order of every
round, read from round/slot (the legs' work times corroborate it only where they are credible);
per-round raw throughput and loss 1 - T_BI1/T_BI0; then per concurrency the question's frozen
formula, labelled. A target c over budget fails whatever the average says; single-round and
aggregate overruns are reported apart; a loss inside the noise floor is reported as such;
invalid rounds are kept with their reasons; fast/slow tiers in an arm make the attribution
`inconclusive`; a profiled leg never counts. The rounds handed in at a concurrency run 1..max
with no gap (a missing round, or one numbered below 1, leaves that c inconclusive, named); a
round past the frozen `repeats` stands in only for an invalid round that is present, never for
an absent one. A leg whose leg.json resolved_config and bench file record one workload value
differently is invalid; two legs whose bench files are one measurement (the same bytes, or the
same recorded date, duration and counts) never count as two rounds, and leave their c
inconclusive. Crossed rounds compare the arms on one machine:
every leg of the valid rounds must record the node it ran on (`env.TICA_NODE`, as
resources.ray_legs gives it, or `resolved_config.node`, as TICA's producers and `tica leg run`
record this host) and name the same one; legs on two nodes, a node some legs record and others do
not, or none recorded are no pass (an overrun found stands, unattributed).

With a reviewed statistical basis (tica.stats.throughput) a target c passes only when the
frozen test's one-sided upper bound is under its budget; short of that it is inconclusive and
says about how many more crossed rounds would decide. Without one a target c is never declared
passed (the practice: "without a reviewed statistical basis, report only measured values and do
not declare the budget passed"): a frozen statistic at or under its budget is reported and the
cell is `inconclusive`; a frozen statistic over its budget is still `fail` by the predefined rule.
Reading, checking and pairing legs (`check_workload`, `pair_rounds`) are shared with `tica plan`.
"""

from __future__ import annotations

import json
import math

import datetime as _dt
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# `import tica.stats.throughput`, not `from tica.stats import throughput`: JUDGE_VERSION hashes
# the modules named by import statements, and the decision lives in that module.
import tica.stats.throughput as budget_test
from tica import leg_times
from tica.evidence import EvidenceItem
from tica.judging import Findings, cell, did_not_run, fmt, led, md_table, wrong_question_cell
from tica.confounders import confounder_markdown, confounder_table, require_recorded, unquantified
from tica.messages import digest
from tica.process_exits import exit_problems
from tica.items.throughput.criteria import WORKLOAD_FIELDS, ThroughputCriteria, ThroughputFormula
from tica.items.throughput.tiers import tier_cause, tier_shape
from tica.question import Question
from tica.receipts import (BENCH_FILE, LEG_FILE, BenchLeg, BenchResult, is_unknown, load_bench_leg, load_leg_meta,
                           read_receipt, recorded_value)
from tica.seal import sha256_file
from tica.verdict import Verdict, VerdictCell


def formal_statistic(formula: ThroughputFormula, t_bi1: Sequence[float], t_bi0: Sequence[float]) -> float:
    """The frozen per-concurrency statistic over paired rounds (index r pairs t_bi1[r] with t_bi0[r])."""
    if len(t_bi1) != len(t_bi0) or not t_bi1:
        raise ValueError("paired rounds need equal, non-zero counts")
    if formula is ThroughputFormula.MEDIAN_PER_ROUND_PAIRED_LOSS:
        return statistics.median(1.0 - a / b for a, b in zip(t_bi1, t_bi0))
    return 1.0 - statistics.median(t_bi1) / statistics.median(t_bi0)


@dataclass
class LegCheck:
    leg: BenchLeg
    throughput: float
    problems: list[str] = field(default_factory=list)
    exits: list[str] = field(default_factory=list)  # the exit problems among `problems`
    unknowns: list[str] = field(default_factory=list)  # workload fields the leg does not record

    def unknown_where(self) -> str:
        """Where the unknown fields were looked for, in words."""
        if self.leg.meta is None:
            return self.leg.path.name
        return f"{LEG_FILE} resolved_config, {BENCH_FILE}"


def _metric(leg: BenchLeg, criteria: ThroughputCriteria) -> float:
    v = getattr(leg.bench, criteria.throughput_metric)
    return float(v) if v is not None else float("nan")


# vllm bench serve computes its throughputs from its own counts over its own duration.
_RATES = (("output_throughput", ("total_output_tokens",)), ("request_throughput", ("completed",)),
          ("total_token_throughput", ("total_input_tokens", "total_output_tokens")))


def _self_contradictions(b: Any) -> list[str]:
    """A throughput the receipt states that its own counts and duration do not give: the
    statement is not evidence (the judge never takes a rate on faith)."""
    out = []
    for rate, counts in _RATES:
        stated = getattr(b, rate, None)
        if stated is None:
            continue
        if not b.duration > 0:
            out.append(f"duration {b.duration}: {rate} {stated} cannot be checked")
            continue
        recomputed = sum(getattr(b, c) for c in counts) / b.duration
        if not math.isclose(stated, recomputed, rel_tol=1e-6, abs_tol=1e-9):
            out.append(f"{rate} {stated:.6g} but {' + '.join(counts)} / duration = {recomputed:.6g}: "
                       "the receipt contradicts itself")
    return out


# Where a bench file records a workload field itself: BenchResult's typed fields, or a top-level
# key it carries (`--metadata input_len=8192`, vllm's own names for the random dataset's lengths).
_BENCH_KEYS: dict[str, tuple[str, ...]] = {
    "num_warmups": ("num_warmups",), "ignore_eos": ("ignore_eos",), "num_prompts": ("num_prompts",),
    "input_len": ("input_len", "random_input_len"), "output_len": ("output_len", "random_output_len")}


def _as_recorded(v: Any) -> Any:
    """A workload value as a receipt states it, read as bench metadata is (top-level strings)."""
    if isinstance(v, str):
        t = v.strip()
        if t.lower() in ("true", "false"):
            return t.lower() == "true"
        if t.lstrip("-").isdigit():
            return int(t)
    return v


def _same_value(a: Any, b: Any) -> bool:
    a, b = _as_recorded(a), _as_recorded(b)
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return a == b


def receipt_disagreements(leg: BenchLeg) -> list[str]:
    """Workload values that the leg's leg.json resolved_config and its bench file both record,
    and record differently. `BenchLeg.workload` reads resolved_config first: a bench file that
    says otherwise is not overruled in silence, the leg's workload is simply not known."""
    if leg.meta is None:
        return []
    config = leg.meta.resolved_config
    extra = leg.bench.model_extra or {}
    out = []
    for key in WORKLOAD_FIELDS:
        said = config.get(key)
        if is_unknown(said):
            continue
        for bkey in _BENCH_KEYS.get(key, (key,)):
            got = getattr(leg.bench, bkey) if bkey in BenchResult.model_fields else extra.get(bkey)
            if is_unknown(got) or _same_value(said, got):
                continue
            out.append(f"{key}: {leg.path.name}/{LEG_FILE} resolved_config.{key} = {said!r} but "
                       f"{leg.path.name}/{BENCH_FILE} {bkey} = {got!r}: the leg's two receipts disagree, "
                       "its workload is not known")
    return out


def check_workload(leg: BenchLeg, criteria: ThroughputCriteria) -> LegCheck:
    """The leg's workload receipt, item by item, against the frozen workload."""
    b = leg.bench
    chk = LegCheck(leg=leg, throughput=_metric(leg, criteria))
    p = chk.problems
    if leg.meta is not None:
        # Client and server exits, each verified on its own, before anything is computed.
        chk.exits += [f"exit: {why}" for why in exit_problems(leg.meta)]
        p += chk.exits
    if leg.meta is not None and leg.meta.item != "throughput":
        p.append(f"a {leg.meta.item} leg, not a throughput leg")
    if leg.meta is not None and leg.meta.not_run_reason:
        p.append(did_not_run("", leg.meta.not_run_reason))
    p += _self_contradictions(leg.bench)
    p += time_contradictions(leg)
    if leg.profiled:
        p.append("profiled: never a formal end-to-end measurement")
    if leg.round is None or leg.slot is None:
        p.append("round/slot not recorded (--metadata round=R slot=S)")
    if leg.round is not None and leg.round < 1:
        p.append(f"round {leg.round}: rounds are numbered from 1")
    c = leg.concurrency
    want = criteria.num_prompts.get(c) if criteria.num_prompts and c is not None else None
    expected = want if want is not None else b.num_prompts
    if b.completed != expected:
        p.append(f"completed {b.completed} of {expected} requests")
    if b.error_count:
        p.append(f"{b.error_count} failed requests")
    tol = criteria.token_tolerance
    for name, actual, per in (("input", b.total_input_tokens, criteria.input_len),
                              ("output", b.total_output_tokens, criteria.output_len)):
        exp = expected * per
        if abs(actual - exp) > tol * exp:
            p.append(f"total_{name}_tokens {actual}, the workload gives {exp} ({expected} x {per})")
    # Every workload field alike: recorded and different invalidates the leg; not recorded is
    # unknown, and the question (required_workload) decides whether that leaves its c undecided.
    frozen = {"num_warmups": criteria.warmups, "input_len": criteria.input_len, "output_len": criteria.output_len,
              "ignore_eos": criteria.ignore_eos, "num_prompts": want}
    for key in WORKLOAD_FIELDS:
        got = b.num_prompts if key == "num_prompts" else leg.workload(key)
        if is_unknown(got):
            chk.unknowns.append(key)
        elif key == "num_warmups" and (isinstance(got, bool) or not isinstance(got, int)):
            p.append(f"warm-up count {got!r} is not a whole number of requests")
        elif key == "num_warmups" and got != frozen[key]:
            p.append(f"{got} warm-up requests, the workload fixes {frozen[key]}")
        elif frozen[key] is not None and got != frozen[key]:
            p.append(f"{key} {got!r}, the workload fixes {frozen[key]!r}")
    p += receipt_disagreements(leg)
    if not (chk.throughput > 0):
        p.append(f"{criteria.throughput_metric} is {chk.throughput}")
    return chk


# Older producers stamped started_at and ended_at when leg.json was written (microseconds apart),
# not when the work ran. A bench leg takes seconds at least, so times closer than this are
# taken as write stamps and never used to order legs.
MIN_WORK_SECONDS = 1.0


def _leg_times(leg: BenchLeg) -> tuple[leg_times.TimeValue, leg_times.TimeValue] | None:
    """(started, ended) as leg.json records them, whatever their span; None where either is not
    recorded or not readable, or one names a zone and the other not (tica.leg_times: every item
    names such a leg)."""
    if leg.meta is None:
        return None
    try:
        start, end = leg_times.parse(leg.meta.started_at), leg_times.parse(leg.meta.ended_at)
    except ValueError:
        return None
    if start is None or end is None or start.aware != end.aware:
        return None
    return start, end


def work_times(leg: BenchLeg) -> tuple[leg_times.TimeValue, leg_times.TimeValue] | None:
    """(started, ended) when the leg records credible work times, else None."""
    times = _leg_times(leg)
    return times if times is not None and (times[1].at - times[0].at).total_seconds() >= MIN_WORK_SECONDS else None


# vLLM stamps a result's `date` in the client's local time (no zone): any zone is at most
# leg_times.MAX_ZONE_OFFSET from UTC.
SLACK = _dt.timedelta(hours=1)


def time_contradictions(leg: BenchLeg) -> list[str]:
    """A leg that ends before it starts, or a bench result dated outside the leg's work (any
    zone's local time, an hour's slack, the run's duration before it): a stale result of another
    run, or times that contradict themselves, are no measurement of this leg."""
    times = _leg_times(leg)
    if times is None:
        return []
    start, end = times
    out = []
    if end.at < start.at:
        out.append(f"ended_at {leg.meta.ended_at} is before started_at {leg.meta.started_at}: "  # type: ignore[union-attr]
                   "the leg's times contradict themselves")
    date = (leg.bench.model_extra or {}).get("date")
    try:
        stamped = _dt.datetime.strptime(date, "%Y%m%d-%H%M%S") if isinstance(date, str) else None
    except ValueError:
        stamped = None
    if stamped is not None:
        # Zone-less leg times are read as the same local clock as the bench's date; times with a
        # zone are placed against it in any zone.
        zone = leg_times.MAX_ZONE_OFFSET if start.aware else _dt.timedelta(0)
        first, last = (t.at.replace(tzinfo=None) for t in (start, max(start, end, key=lambda t: t.at)))
        lo = first - zone - SLACK - _dt.timedelta(seconds=leg.bench.duration)
        hi = last + zone + SLACK
        if not lo <= stamped <= hi:
            out.append(f"{BENCH_FILE} is dated {date}, outside the leg's work ({leg.meta.started_at} to "  # type: ignore[union-attr]
                       f"{leg.meta.ended_at}, in any zone): the result of another run")
    return out


@dataclass
class Round:
    c: int
    number: int
    legs: list[LegCheck]
    expected: str
    arms: tuple[str, str] = ("bi1", "bi0")  # slot order under the frozen order (Question.round_arms)
    problems: list[str] = field(default_factory=list)
    t_bi1: float | None = None
    t_bi0: float | None = None

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def loss(self) -> float | None:
        return 1.0 - self.t_bi1 / self.t_bi0 if self.t_bi1 is not None and self.t_bi0 else None

    @property
    def observed(self) -> str:
        by_slot = {lc.leg.slot: lc.leg.arm for lc in self.legs}
        return "/".join(str(by_slot.get(s, "?")) for s in (1, 2))


def check_round(rnd: Round, criteria: ThroughputCriteria, ignore_exits: bool = False) -> None:
    """Record why a round is invalid (nothing when it is valid) and, if valid, its throughputs.
    `ignore_exits` is for a plan's pilot alone (the judge never sets it): a round whose legs'
    only problems are their exit receipts still measures the noise of the workload."""
    p = rnd.problems
    arms = sorted(str(lc.leg.arm) for lc in rnd.legs)
    if arms != ["bi0", "bi1"]:
        p.append(f"legs {arms}: a round is one BI=1 and one BI=0 leg")
        return
    for lc in rnd.legs:
        for prob in lc.problems:
            if ignore_exits and prob in lc.exits:
                continue
            p.append(f"{lc.leg.arm} leg {lc.leg.path.name}: {prob}")
    slots = {lc.leg.slot: lc for lc in rnd.legs}
    if set(slots) != {1, 2}:
        p.append(f"slots {sorted(map(str, slots))}: a round has slot 1 and slot 2")
    else:
        first = rnd.arms[0]
        if slots[1].leg.arm != first:
            p.append(f"order {slots[1].leg.arm} then {slots[2].leg.arm}; the frozen order {rnd.expected} "
                     f"(A = {criteria.arm_a}) puts {first} first")
        w1, w2 = work_times(slots[1].leg), work_times(slots[2].leg)
        if w1 is not None and w2 is not None:
            first_starts = leg_times.ordered(w1[0], w2[0])
            if first_starts is None or w1[0].aware != w2[0].aware:
                p.append(f"slot 1 started at {slots[1].leg.meta.started_at} and slot 2 at "  # type: ignore[union-attr]
                         f"{slots[2].leg.meta.started_at}: one names a time zone and the other does not, so the "
                         "order of the slots cannot be shown")
            elif not (first_starts and w1[0].at != w2[0].at):
                p.append(f"slot 1 started at {w1[0].at.isoformat()}, not before slot 2 at {w2[0].at.isoformat()}")
            elif w1[1].at > w2[0].at:
                p.append(f"slot 1 ended at {w1[1].at.isoformat()}, after slot 2 started at {w2[0].at.isoformat()}: "
                         "the legs overlapped")
    legs = {lc.leg.arm: lc for lc in rnd.legs}
    if legs["bi1"].leg.bench.completed != legs["bi0"].leg.bench.completed:
        p.append("the arms completed different request volumes; no loss is computed from them")
    if not p:
        rnd.t_bi1, rnd.t_bi0 = legs["bi1"].throughput, legs["bi0"].throughput


def _not_run_meta(path: Path) -> dict | None:
    """leg.json of a leg directory that did not run (read loosely: the judge validates it later)."""
    try:
        meta = read_receipt(path / LEG_FILE) if path.is_dir() else None
    except (OSError, ValueError):
        return None
    if not (isinstance(meta, dict) and meta.get("not_run_reason")):
        return None
    strict = load_leg_meta(path / LEG_FILE)  # through the one model: a leg without its arm is refused by name
    return {"arm": strict.arm, "not_run_reason": strict.not_run_reason}


def _leg_arm(path: Path) -> str | None:
    try:
        arm = read_receipt(path / LEG_FILE).get("arm") if path.is_dir() else read_receipt(path).get("arm")
    except (OSError, ValueError, AttributeError):
        return None
    return arm if isinstance(arm, str) else None


def not_run_legs(leg_paths: Sequence[str | Path]) -> dict[Path, dict]:
    """leg.json of every leg directory among leg_paths that records it did not run."""
    return {Path(p): meta for p in leg_paths if (meta := _not_run_meta(Path(p))) is not None}


def leg_name(leg: BenchLeg) -> str:
    return f"{leg.path.parent.name}/{leg.path.name}"


def _bench_path(leg: BenchLeg) -> Path:
    return leg.path / BENCH_FILE if leg.meta is not None else leg.path


@dataclass
class SameMeasurement:
    """Legs whose bench files are one measurement: the same bytes, or the same recorded identity."""
    c: int | None
    legs: list[LegCheck]
    why: list[str]

    def names(self) -> str:
        return " and ".join(leg_name(lc.leg) for lc in self.legs)


# What a `vllm bench serve` result measured, apart from what it says about itself (arm, round,
# slot, labels): the content identity of a run. Two runs never agree to the bit on all of these.
_MEASURED = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
             "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
             "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms")


def _identity(b: BenchResult) -> tuple | None:
    """The run a result records, by content: its date with its duration and counts (two runs do
    not end at the same second after the same duration with the same counts). Labels (arm, round,
    slot) are no part of it: a copy relabelled as another round is the same run. No date: None."""
    date = (b.model_extra or {}).get("date")
    if not isinstance(date, str) or not date.strip():
        return None
    return (date.strip(), b.duration, b.num_prompts, b.max_concurrency, b.completed, b.failed,
            b.total_input_tokens, b.total_output_tokens)


def _measured(b: BenchResult) -> tuple:
    """Every measured number of a result, labels and date left out."""
    return tuple(getattr(b, k) for k in _MEASURED)


def same_measurements(checks: Sequence[LegCheck]) -> list[SameMeasurement]:
    """Groups of two or more legs that hand in one measurement: their bench files have the same
    sha256, record the same date, duration and counts (`_identity`), or the same measured numbers
    (`_measured`), whatever arm, round or slot they are labelled with. Each such group is one
    run counted several times, whichever leg it really belongs to."""
    by_key: dict[tuple, list[int]] = defaultdict(list)
    for i, chk in enumerate(checks):
        try:
            by_key[("sha256", "sha256:" + sha256_file(_bench_path(chk.leg)))].append(i)
        except OSError:
            pass
        ident = _identity(chk.leg.bench)
        if ident is not None:
            by_key[("identity", *ident)].append(i)
        by_key[("measured", *_measured(chk.leg.bench))].append(i)
    groups: dict[tuple[int, ...], list[str]] = {}
    for key, idx in by_key.items():
        if len(idx) < 2:
            continue
        why = (f"their bench files have the same content, {digest(key[1])}" if key[0] == "sha256" else
               f"their bench files record the same run: date {key[1]}, duration {key[2]!r} s, "
               f"{key[5]} completed, {key[7]} input and {key[8]} output tokens" if key[0] == "identity" else
               f"their bench files measured the same numbers to the bit, duration {key[1]!r} s and "
               f"{key[7]!r} output tokens/s: one run, whatever its labels say")
        groups.setdefault(tuple(sorted(idx)), []).append(why)
    return [SameMeasurement(c=checks[idx[0]].leg.concurrency, legs=[checks[i] for i in idx], why=why)
            for idx, why in sorted(groups.items())]


def pair_rounds(question: Question, checks: Sequence[LegCheck],
                ignore_exits: bool = False) -> tuple[list[Round], list[tuple[LegCheck, str]]]:
    """Checked legs grouped into checked rounds per concurrency (sorted by c, round), and the
    legs set aside with why (outside the frozen concurrencies, or no round). A round numbered
    below 1 is kept, invalid, and never given a frozen order; a round holding a leg whose bench
    file is another leg's measurement too (`same_measurements`) is invalid."""
    criteria: ThroughputCriteria = question.criteria  # type: ignore[assignment]
    grouped: dict[tuple[int, int], list[LegCheck]] = defaultdict(list)
    aside: list[tuple[LegCheck, str]] = []
    for chk in checks:
        c, r = chk.leg.concurrency, chk.leg.round
        if c is None or c not in criteria.concurrencies or r is None:
            why = "max_concurrency not in the question's concurrencies" if r is not None else "no round"
            aside.append((chk, f"{why}: c={c}"))
            continue
        grouped[(c, r)].append(chk)
    rounds = [Round(c=c, number=r, legs=lcs, expected=question.round_order(r) if r >= 1 else "-",
                    arms=question.round_arms(r) if r >= 1 else ("bi1", "bi0"))
              for (c, r), lcs in sorted(grouped.items())]
    twice: dict[int, list[str]] = defaultdict(list)
    for same in same_measurements(checks):
        for lc in same.legs:
            others = " and ".join(leg_name(o.leg) for o in same.legs if o is not lc)
            twice[id(lc)].append(f"the same measurement as {others} ({'; '.join(same.why)})")
    for rnd in rounds:
        if rnd.number < 1:
            rnd.problems.append(f"round {rnd.number}: rounds are numbered from 1; no round of the frozen order, "
                                "refused")
            continue
        check_round(rnd, criteria, ignore_exits)
        for lc in rnd.legs:
            rnd.problems += [f"{lc.leg.arm} leg {lc.leg.path.name}: {why}" for why in twice.get(id(lc), ())]
        if rnd.problems:
            rnd.t_bi1 = rnd.t_bi0 = None
    return rounds, aside


def _arm_leg(rnd: Round, arm: str) -> LegCheck | None:
    return next((lc for lc in rnd.legs if lc.leg.arm == arm), None)


def _tier_row(c: int, arm: str, number: int, t: float, lc: LegCheck | None) -> list[Any]:
    tel = lc.leg.meta.telemetry if lc and lc.leg.meta else None
    if tel is None:
        return [c, arm, number, t] + ["unknown"] * (len(TIER_COLUMNS) - 4)
    return [c, arm, number, t, tel.sm_clock_mhz_median, tel.mem_clock_mhz_median, tel.power_w_median,
            tel.temperature_c_max, tel.gpu_util_pct_median,
            "unknown" if tel.throttle_reasons is None else ", ".join(tel.throttle_reasons) or "none",
            f"{fmt(tel.cpu_load_1m_start)}/{fmt(tel.cpu_load_1m_end)}",
            "unknown" if tel.cpu_util is None else "/".join(
                fmt(tel.cpu_util.get(r)) for r in ("engine_core", "api_server", "client")),
            tel.engine_steps, tel.engine_itl_ms_mean, f"{fmt(tel.cpu_steal_pct)}/{fmt(tel.cpu_busy_pct)}",
            tel.cpu_probe_ms_median,
            "unknown" if tel.engine_cpus is None else
            f"{', '.join(map(str, tel.engine_cpus))} ({fmt(tel.engine_cpu_moves_pct)}% moves)",
            "unknown" if tel.cpu_loop_ms_min is None else
            f"{fmt(tel.engine_cpu_loop_ms)} (CPUs {fmt(tel.cpu_loop_ms_min)} to {fmt(tel.cpu_loop_ms_max)})",
            tel.served_before]


TIER_COLUMNS = ["c", "arm", "round", "throughput", "SM clock MHz", "memory clock MHz", "power W", "peak C",
                "GPU util %", "throttling", "CPU load start/end", "CPU s/s engine/API/client", "engine steps",
                "engine ITL ms", "host CPU stolen/busy %", "CPU probe ms", "engine CPUs",
                "pinned loop ms: engine CPU (all CPUs)", "legs served before"]


def tier_ratio(ts: Sequence[float]) -> float | None:
    """max/min throughput within one arm (None under two values)."""
    return max(ts) / min(ts) if len(ts) >= 2 and min(ts) > 0 else None


def _unknowns(rounds: Sequence[Round], criteria: ThroughputCriteria
              ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The workload fields the legs of these rounds do not record, as (field, where), split into
    those the question requires and those it relaxes."""
    found: dict[str, set[str]] = defaultdict(set)
    for rnd in rounds:
        for lc in rnd.legs:
            for key in lc.unknowns:
                found[key].add(lc.unknown_where())
    pairs = [(k, ", ".join(sorted(found[k]))) for k in WORKLOAD_FIELDS if k in found]
    return ([x for x in pairs if x[0] in criteria.required_workload],
            [x for x in pairs if x[0] not in criteria.required_workload])


def _listed(pairs: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{k} ({where})" for k, where in pairs)


# Where a leg records the node it ran on: resources.ray_legs.RayLegRunner puts TICA_NODE in the
# producer's environment (every TICA producer records TICA_* in leg.json's env); a producer outside
# TICA may record resolved_config.node.
NODE_KEYS = ("env.TICA_NODE", "resolved_config.node")


def leg_node(leg: BenchLeg) -> str | None:
    """The node a leg records (None: not recorded); a leg naming two nodes names both, joined."""
    if leg.meta is None:
        return None
    found = sorted({str(v) for key in NODE_KEYS if (v := recorded_value(leg.meta, key)) is not None})
    return " + ".join(found) or None


def same_node(findings: Findings, numbers: dict[str, Any], legs: Sequence[BenchLeg]) -> None:
    """Every leg of the pairing on one node, as the practice demands ("same node, same resources").
    Legs on different nodes, a node recorded by some legs and not others, or no node recorded at
    all are no pass: the comparison is confounded by the node, or not known to be free of it. An
    overrun already found stands, its cause not attributed."""
    by_node: dict[str | None, list[str]] = defaultdict(list)
    for leg in legs:
        by_node[leg_node(leg)].append(leg.path.parent.name + "/" + leg.path.name if leg.meta else leg.path.name)
    recorded = {n: ls for n, ls in by_node.items() if n is not None}
    numbers["nodes"] = {n: len(ls) for n, ls in sorted(recorded.items())} or None
    if not legs:
        return
    problem = None
    if not recorded:
        problem = (f"no leg records the node it ran on ({' or '.join(NODE_KEYS)}): the pairing is not shown to "
                   "have run on one node")
    elif len(recorded) > 1:
        problem = ("the pairing's legs ran on different nodes: " + "; ".join(
            f"{n}: {len(ls)} leg(s) ({', '.join(ls[:3])}{' ...' if len(ls) > 3 else ''})" for n, ls in sorted(recorded.items()))
            + ": a throughput comparison across nodes is confounded by the node, not attributed to the switch")
    elif None in by_node:
        unknown = by_node[None]
        problem = (f"node {next(iter(recorded))} recorded by {sum(map(len, recorded.values()))} of {len(legs)} legs; "
                   f"unknown for {', '.join(unknown[:3])}{' ...' if len(unknown) > 3 else ''}: the pairing is not "
                   "known to have run on one node")
    if problem is None:
        return
    if findings.verdict is Verdict.FAIL:
        findings.note(problem + " (the overrun stands; its cause is not attributed to the switch)")
    else:
        findings.inconclusive(problem)


def _valid_rounds(rounds: Sequence[Round]) -> str:
    """Valid rounds of all handed in, per concurrency (a crossed round is counted once per c)."""
    per_c: dict[int, list[bool]] = defaultdict(list)
    for r in rounds:
        per_c[r.c].append(bool(r.valid))
    counts = {c: (sum(v), len(v)) for c, v in sorted(per_c.items())}
    if not counts:
        return "0/0 valid rounds"
    if len(set(counts.values())) == 1:
        valid, total = next(iter(counts.values()))
        where = f"c={next(iter(counts))}" if len(counts) == 1 else f"each of c={', '.join(map(str, counts))}"
        return f"{valid}/{total} valid rounds at {where}"
    return "valid rounds " + ", ".join(f"c={c} {v}/{t}" for c, (v, t) in counts.items())


# What `vllm bench serve` records of how it ran (beside the workload): alike across the pairing, or
# the arms are compared under different load or against a different endpoint (a throttled request
# rate caps the baseline's throughput).
BENCH_SETTINGS = ("request_rate", "burstiness", "model_id", "tokenizer_id", "backend", "endpoint_type")


def bench_settings(findings: Findings, numbers: dict[str, Any], legs: Sequence[BenchLeg],
                   quantified: Mapping[str, str]) -> None:
    """Every run setting a bench file records, the same in every leg of the pairing (a question's
    quantified_confounders may name `bench.<key>` as aligned or quantified elsewhere)."""
    differ: dict[str, dict[str, int]] = {}
    for key in BENCH_SETTINGS:
        if f"bench.{key}" in quantified:
            continue
        seen: dict[str, int] = defaultdict(int)
        for leg in legs:  # a setting some legs record and others do not is not shown alike: unknown differs
            value = (leg.bench.model_extra or {}).get(key)
            seen["unknown" if is_unknown(value) else json.dumps(value, sort_keys=True)] += 1
        if len(seen) > 1:
            differ[key] = dict(sorted(seen.items()))
    numbers["bench_settings_differ"] = differ or None
    for key, values in differ.items():
        problem = (f"bench.{key} differs between the pairing's legs ("
                   + ", ".join(f"{v}: {n} leg(s)" for v, n in values.items())
                   + "): a run setting, not the switch, differs between the measurements")
        if findings.verdict is Verdict.FAIL:
            findings.note(problem + " (the overrun stands; its cause is not attributed to the switch)")
        else:
            findings.inconclusive(problem)


def _counted(r: Any, per_c: dict[int, dict[str, Any]], repeats: int) -> str:
    """Whether the statistic counts a round, and why not."""
    if r.number in per_c.get(r.c, {}).get("valid_rounds", ()):
        return "yes"
    if not r.valid:
        return "no: invalid"
    return f"no: beyond the {repeats} frozen rounds" if r.number > repeats else "no"


def percent(x: float) -> str:
    return f"{100 * x:.3g}%"


def loss_in_words(formula: ThroughputFormula | None, loss: float) -> str:
    """A loss as a person says it: what BI=1 gives up against BI=0, under the frozen formula."""
    if formula is ThroughputFormula.RATIO_OF_MEDIAN_THROUGHPUTS:
        return f"BI=1's median throughput is {percent(loss)} below BI=0's"
    return f"BI=1 loses a median {percent(loss)} of BI=0's throughput per round"


def judge_throughput(question: Question, leg_paths: Sequence[str | Path]) -> VerdictCell:
    item = EvidenceItem.THROUGHPUT
    if (wrong := wrong_question_cell(item, question)) is not None:
        return wrong
    findings = Findings()
    criteria: ThroughputCriteria = question.criteria  # type: ignore[assignment]
    not_run = not_run_legs(leg_paths)
    for p, meta in not_run.items():
        findings.not_run(did_not_run(f"{meta['arm']} {p.parent.name}/{p.name}: ", meta['not_run_reason']))
    ran = [Path(p) for p in leg_paths if Path(p) not in not_run]
    arms_ran = {_leg_arm(p) for p in ran}
    if not ran or not {"bi1", "bi0"} <= arms_ran:
        missing = sorted({"bi1", "bi0"} - arms_ran)
        summary = f"no {', '.join(missing)} leg ran: nothing to pair"
        findings.not_run(summary)  # also with no legs at all: nothing measured is never a pass
        return cell(item, question, findings, summary, receipt_hashes={str(p): "" for p in not_run})
    legs = [load_bench_leg(p) for p in ran]
    hashes = {str(l.path): l.digest for l in legs}
    require_recorded(findings, question, [(l.path.name, l.meta) for l in legs if l.meta is not None])
    stamped = [l.path.name for l in legs if l.meta is not None and work_times(l) is None]
    if stamped:
        findings.note(f"{len(stamped)} leg(s) record no credible work times (ended_at - started_at under "
                      f"{MIN_WORK_SECONDS:g} s: stamped when leg.json was written): their order is read from round/slot only")
    checks = [check_workload(l, criteria) for l in legs]
    tables: dict[str, str] = {}
    numbers: dict[str, Any] = {"metric": criteria.throughput_metric,
                               "formula": criteria.formula.value if criteria.formula else None,
                               "formula_label": question.formula_label}

    # Group legs into rounds per concurrency; a leg outside the frozen concurrencies is set aside.
    rounds, aside = pair_rounds(question, checks)
    for chk, why in aside:
        findings.note(f"{chk.leg.path.name}: set aside ({why})")
    for rnd in rounds:
        if not rnd.valid:
            findings.note(f"c={rnd.c} round {rnd.number} invalid, kept: " + "; ".join(rnd.problems))

    leg_rows = []
    for chk in checks:
        b = chk.leg.bench
        leg_rows.append([chk.leg.path.name, chk.leg.arm, chk.leg.concurrency, chk.leg.round, chk.leg.slot,
                         b.completed, b.error_count, b.total_input_tokens, b.total_output_tokens,
                         chk.leg.workload("num_warmups"), b.duration, chk.throughput, b.mean_ttft_ms,
                         b.median_ttft_ms, b.p99_ttft_ms, b.mean_tpot_ms, b.median_tpot_ms, b.p99_tpot_ms,
                         ("ok" if not chk.problems else "inconclusive: " + "; ".join(chk.problems))
                         + ("; unknown: " + ", ".join(chk.unknowns) if chk.unknowns else "")])
    tables["per leg (workload receipts)"] = md_table(
        ["file", "arm", "c", "round", "slot", "completed", "errors", "input tokens", "output tokens", "warm-ups",
         "duration s", criteria.throughput_metric, "mean TTFT ms", "median TTFT ms", "p99 TTFT ms",
         "mean TPOT ms", "median TPOT ms", "p99 TPOT ms", "status"], leg_rows)
    numbers["rounds"] = [{"c": r.c, "round": r.number, "expected_order": r.expected, "observed": r.observed,
                          "t_bi1": r.t_bi1, "t_bi0": r.t_bi0, "loss": r.loss, "valid": r.valid,
                          "reasons": r.problems} for r in rounds]

    # Per concurrency: the frozen formula over valid rounds, the budget, single-round overruns, tiers.
    budget = criteria.budget or {}
    per_c: dict[int, dict[str, Any]] = {}
    single_overruns, aggregate_overruns, tiers = [], [], []
    tier_rows: list[list[Any]] = []
    basis = criteria.statistical_basis
    decisions: dict[int, budget_test.ThroughputDecision] = {}
    if basis is not None and basis.test not in budget_test.KNOWN_TESTS:
        findings.inconclusive(f"the statistical basis names test {basis.test!r}, which this TICA does not know "
                              f"({', '.join(sorted(budget_test.KNOWN_TESTS))}): no budget is declared passed")
        basis = None  # never decided by a rule this code does not have
    # One measurement handed in as several legs never counts as several rounds: those rounds are
    # invalid (pair_rounds) and their c inconclusive, whichever leg the run belongs to.
    for same in same_measurements(checks):
        msg = (f"c={same.c}: {same.names()} are one measurement counted {len(same.legs)} times "
               f"({'; '.join(same.why)}): a round is its own A/B pair, so none of them counts as a round")
        (findings.inconclusive if same.c in criteria.concurrencies else findings.note)(msg)
    for c in criteria.concurrencies:
        # Rounds run 1..max with no gap: a round that was run is handed in, invalid or not, never
        # left out; a round numbered below 1 is no round of the frozen order.
        at_c = [r for r in rounds if r.c == c]
        below = sorted(r.number for r in at_c if r.number < 1)
        numbered = [r for r in at_c if r.number >= 1]
        top = max((r.number for r in numbered), default=0)
        missing = sorted(set(range(1, top + 1)) - {r.number for r in numbered})
        if below:
            findings.inconclusive(f"c={c}: round(s) {below} numbered below 1: rounds are numbered from 1 in the "
                                  "frozen order; refused (kept, never judged)")
        if missing:
            findings.inconclusive(f"c={c}: round(s) {missing} missing of rounds 1..{top} handed in: every round "
                                  "that was run is kept (an invalid one with its reason), none is left out, and a "
                                  "later round never stands in for an absent one")
        # The frozen rounds 1..repeats; a round past them only stands in for an invalid frozen
        # round that is present (its retest), never for an absent one. Extra valid rounds are kept
        # and shown, never added to dilute an overrun.
        frozen = [r for r in numbered if r.number <= question.repeats]
        retests = [r for r in numbered if r.number > question.repeats and r.valid]
        stand_in = sum(not r.valid for r in frozen)
        valid = [r for r in frozen if r.valid] + retests[:stand_in]
        extra = retests[stand_in:]
        if extra:
            findings.note(f"c={c}: rounds {[r.number for r in extra]} are valid beyond the {question.repeats} frozen; "
                          "kept, not judged (a retest replaces an invalid round, it does not add to the sample)")
        t1 = [r.t_bi1 for r in valid]
        t0 = [r.t_bi0 for r in valid]
        entry: dict[str, Any] = {"valid_rounds": [r.number for r in valid], "t_bi1": t1, "t_bi0": t0,
                                 "losses": [r.loss for r in valid], "statistic": None, "budget": budget.get(c),
                                 "over_budget": None, "single_round_overruns": [], "tiers": {},
                                 "inside_noise_floor": None, "missing_rounds": missing, "rounds_below_1": below}
        per_c[c] = entry
        target = c in budget
        # Listed over every round at c; only the judged rounds' required unknowns hold c undecided.
        required, relaxed = _unknowns([r for r in rounds if r.c == c], criteria)
        blocking = _unknowns(valid, criteria)[0]
        entry["unknown"] = {"required": [k for k, _ in required], "not_required": [k for k, _ in relaxed]}
        if required:
            msg = (f"c={c}: unknown: {_listed(required)}: the question requires them (required_workload), so the "
                   "rounds' workload is not verified")
            if target and (blocking or not valid):
                findings.inconclusive(msg)
            else:
                findings.note(msg + (" (c has no budget: reported)" if not target else " (in rounds not judged)"))
        if relaxed:
            findings.note(f"c={c}: unknown: {_listed(relaxed)}: not required by the question, judged without them")
        if len(valid) < question.repeats:
            msg = f"c={c}: {len(valid)} valid round(s) of the {question.repeats} frozen"
            if top < question.repeats:
                msg += f" (round(s) {list(range(top + 1, question.repeats + 1))} not handed in)"
            (findings.inconclusive if target else findings.note)(msg)
        for arm, ts in (("bi1", t1), ("bi0", t0)):
            x = tier_ratio(ts)
            if x is not None and x > criteria.tier_ratio:
                entry["tiers"][arm] = x
                arm_legs = [(t, _arm_leg(r, arm)) for r, t in zip(valid, ts)]
                cause = tier_cause([(t, lc.leg.meta.telemetry if lc and lc.leg.meta else None) for t, lc in arm_legs])
                shape = tier_shape([(t, lc.leg.bench.median_itl_ms, lc.leg.bench.mean_itl_ms) if lc else (t, None, None)
                                    for t, lc in arm_legs])
                cause = cause if shape is None else f"{cause}; {shape}"
                entry.setdefault("tier_causes", {})[arm] = cause
                tiers.append((c, arm, x, cause))
                tier_rows += [_tier_row(c, arm, r.number, t, lc) for r, (t, lc) in zip(valid, arm_legs)]
        if not valid or criteria.formula is None:
            continue
        stat = formal_statistic(criteria.formula, t1, t0)  # type: ignore[arg-type]
        entry["statistic"] = stat
        entry["inside_noise_floor"] = abs(stat) <= question.noise_floor
        if question.noise_floor > 0 and entry["inside_noise_floor"]:
            findings.note(f"c={c}: loss {stat:.4g} is inside the noise floor {question.noise_floor:g}: not "
                          "distinguishable from noise" + (f" (budget {budget[c]:g})" if target else ""))
        if target and blocking:
            continue  # measured and shown; neither passed nor failed on a workload not verified
        if target:
            entry["single_round_overruns"] = [r.number for r in valid if r.loss > budget[c]]
            single_overruns += [(c, r.number, r.loss) for r in valid if r.loss > budget[c]]
            if len(valid) >= question.repeats:
                entry["over_budget"] = stat > budget[c]
                if stat > budget[c]:
                    aggregate_overruns.append((c, stat))
            if basis is not None:
                decisions[c] = budget_test.decide(entry["losses"], budget[c], basis)
                entry["decision"] = decisions[c].numbers()
    numbers["per_concurrency"] = {str(c): e for c, e in per_c.items()}
    # Which rounds the statistic counts, beside whether each is valid: a valid round beyond the
    # frozen ones is shown, and says it is not counted.
    tables["per round"] = md_table(
        ["c", "round", "frozen order", "slot 1/slot 2", "T_BI1", "T_BI0", "loss 1-T_BI1/T_BI0", "valid", "counted",
         "reasons"],
        [[r.c, r.number, r.expected, r.observed, r.t_bi1, r.t_bi0, r.loss, r.valid, _counted(r, per_c, question.repeats),
          "; ".join(r.problems)] for r in rounds])
    numbers["noise_floor"] = question.noise_floor
    stats = [e["statistic"] for e in per_c.values() if e["statistic"] is not None]
    # Shown because people ask for it; never judged, so it cannot hide one c over budget.
    numbers["average_across_concurrencies_not_judged"] = statistics.fmean(stats) if stats else None
    numbers["single_round_overruns"] = [{"c": c, "round": r, "loss": l} for c, r, l in single_overruns]
    numbers["aggregate_overruns"] = [{"c": c, "statistic": s} for c, s in aggregate_overruns]
    label = question.formula_label or "no frozen formula"
    tables["per concurrency"] = md_table(
        ["c", "valid rounds", "median T_BI1", "median T_BI0", f"statistic ({label})", "budget", "over budget",
         f"inside noise floor ({question.noise_floor:g})", "single-round overruns", "fast/slow tiers"],
        [[c, len(e["t_bi1"]), statistics.median(e["t_bi1"]) if e["t_bi1"] else None,
          statistics.median(e["t_bi0"]) if e["t_bi0"] else None, e["statistic"], e["budget"], e["over_budget"],
          e["inside_noise_floor"], ", ".join(f"r{r}" for r in e["single_round_overruns"]),
          ", ".join(f"{a} x{x:.3g}" for a, x in e["tiers"].items())] for c, e in per_c.items()])

    for c, s in aggregate_overruns:
        findings.fail(f"c={c}: {loss_in_words(criteria.formula, s)}, over the {percent(budget[c])} budget: an "
                      f"aggregate overrun, {label.split(': ', 1)[-1]} = {s:.4g} > {budget[c]:g}")
    for c, r, l in single_overruns:
        findings.note(f"c={c} round {r}: loss {l:.4g} over the budget {budget[c]:g} (single-round overrun)")
    if criteria.formula is None or not budget:
        findings.inconclusive("no frozen formula and budget: measured values only, the budget is not declared passed")
    elif criteria.statistical_basis is None:
        # A point statistic under the budget is a measured value, not a decision: without a reviewed
        # basis its false-pass rate is unknown, so it is reported and never declared passed.
        for c in budget:
            e = per_c.get(c, {})
            if e.get("over_budget") is False:
                where = "under" if e["statistic"] < budget[c] else "at"
                findings.inconclusive(
                    f"c={c}: loss {e['statistic']:.4g} ({label.split(':')[0]}) {where} the budget {budget[c]:g}, "
                    "but the question has no reviewed statistical basis: reported, not passed "
                    "(tica plan throughput writes one)")
    if criteria.statistical_basis is not None:
        numbers["statistical_basis"] = criteria.statistical_basis.model_dump(mode="json")
    for c, d in decisions.items():
        # A fail is already the aggregate overrun above; the decision adds what its bounds say.
        {budget_test.PASS: findings.note, budget_test.FAIL: findings.note,
         budget_test.INCONCLUSIVE: findings.inconclusive}[d.verdict](f"c={c}: {d.reason}")
    if decisions:
        tables["statistical basis (per target c)"] = md_table(
            ["c", "valid rounds", "median loss", f"lower bound ({1 - basis.alpha:g})",
             f"upper bound ({1 - basis.alpha:g})", "budget", "p (median >= budget)", "SD", "decision",
             "more rounds to decide"],
            [[c, d.rounds, d.statistic, d.lower, d.upper, budget[c], d.p_value, d.sd, d.verdict, d.more_rounds]
             for c, d in decisions.items()])
    for c, arm, x, cause in tiers:
        findings.inconclusive(f"c={c}: {arm} throughput shows fast/slow tiers (max/min {x:.3g} > "
                              f"{criteria.tier_ratio:g}): the loss's causal attribution is inconclusive ({cause})")
    if tier_rows:
        tables["tiers: what each leg ran under"] = md_table(TIER_COLUMNS, tier_rows)

    # One node: crossed rounds compare the arms on one machine; rounds spread over nodes confound
    # the loss with the node, and a node no leg records leaves that unknown.
    same_node(findings, numbers, [lc.leg for r in rounds if r.valid for lc in r.legs])
    bench_settings(findings, numbers, [lc.leg for r in rounds if r.valid for lc in r.legs],
                   criteria.quantified_confounders)

    # Confounders, per concurrency (workload settings legitimately differ between concurrencies).
    loose_keys: set[str] = set()
    conf_rows = []
    unprofiled_unknown = sorted(chk.leg.path.name for chk in checks if chk.leg.profiled is None)
    if unprofiled_unknown:  # measured values are still shown; the cell cannot pass on them
        findings.inconclusive(f"{len(unprofiled_unknown)} leg(s) record nowhere whether the run was profiled "
                              f"({', '.join(unprofiled_unknown[:4])}{' ...' if len(unprofiled_unknown) > 4 else ''}): "
                              "a profiled run is never a formal measurement, and these are not shown not to be")
    bare = [chk.leg.path.name for chk in checks if chk.leg.meta is None]
    if bare:
        findings.inconclusive(f"{len(bare)} bare bench file(s) carry no resolved config or exit receipts: "
                              "confounders cannot be listed, exits cannot be verified")
    for c in criteria.concurrencies:
        ok = [lc.leg.meta for r in rounds if r.c == c and r.valid for lc in r.legs if lc.leg.meta is not None]
        m1 = [m for m in ok if m.arm == "bi1"]
        m0 = [m for m in ok if m.arm == "bi0"]
        if m1 and m0:
            table = confounder_table(m1, m0, criteria.quantified_confounders)
            conf_rows += table
            loose_keys |= {x.key for x in unquantified(table)}
    if conf_rows:
        tables["confounders"] = confounder_markdown(list({x.key + str(x.bi1) + str(x.bi0): x for x in conf_rows}.values()))
    numbers["unquantified_confounders"] = sorted(loose_keys)
    if loose_keys:
        msg = "unquantified confounders between the arms: " + ", ".join(sorted(loose_keys))
        if findings.verdict is Verdict.FAIL:
            findings.note(msg + " (the overrun stands; its cause is not attributed to the switch)")
        else:
            findings.inconclusive(msg)

    judged = [c for c in budget if per_c.get(c, {}).get("over_budget") is not None]
    summary = (f"{_valid_rounds(rounds)}; {label}; "
               + (", ".join(f"c={c} {per_c[c]['statistic']:.3g}{' OVER' if per_c[c]['over_budget'] else ''}"
                            for c in judged) or "no target c judged"))
    unknown = sorted({k for e in per_c.values() for k in e["unknown"]["required"] + e["unknown"]["not_required"]})
    if unknown:
        summary += f"; unknown: {', '.join(unknown)}"
    if criteria.statistical_basis is not None:
        b = criteria.statistical_basis
        summary += f"; basis {b.test} at alpha {b.alpha:g} over {b.rounds} rounds"
    elif budget and criteria.formula is not None:
        summary += "; no statistical basis: measured values only, no budget declared passed"
    over = [str(c) for c in judged if per_c[c]["over_budget"]]
    if findings.verdict is Verdict.FAIL:  # the headline says what failed before what held
        summary = f"over the budget at c={', '.join(over)}; {summary}" if over else led(findings, summary)
    return cell(item, question, findings, summary, numbers, tables, hashes)
