"""Checks of a verdict, computed when it is judged and appended to the ledger with it.

Acceptance reads the verdicts *and* their checks: a pass whose canaries were not all caught,
whose receipts do not match their seals or the ledger, whose question was frozen after a leg had
started, or whose quality counts do not add up, is not accepted. Pure functions, no Dagster; the
Dagster layer shows these outcomes as asset checks.
"""

from __future__ import annotations

import datetime as _dt
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tica import strict_io
from tica.evidence import EvidenceItem
from tica.items.registry import room
from tica.messages import clip, digest, in_leg, relative, without_prefix
from tica.question import Question, QualityCriteria, ThroughputCriteria
from tica.receipts import LEG_FILE, RESULTS_FILE, read_receipt
from tica.seal import SEAL_FILE, check_seal
from tica.verdict import Verdict, VerdictCell

E = EvidenceItem
CANARIES = "canaries_caught"
RECEIPTS = "receipts_sealed"
FROZEN = "frozen_before_run"
QUALITY_SUMS = "quality_sums"
WORKLOAD = "workload_receipts"
# The checks each item's verdict must carry, each passed, before it can be accepted: a verdict
# without one of them is not, and one that failed blocks whatever its own row says. Every item:
# canaries, receipts, frozen before run; beyond them, those the registry names for the item
# (quality its 2x2 sums, throughput its workload receipts).
REQUIRED: dict[EvidenceItem, tuple[str, ...]] = {
    item: (CANARIES, RECEIPTS, FROZEN) + room(item).extra_checks for item in EvidenceItem
}


@dataclass(frozen=True)
class CheckOutcome:
    """One check of one verdict. `blocking`: acceptance needs it passed. `applicable`: False
    when there was nothing to check because the cell cannot pass anyway (shown as a warning,
    recorded as not passed)."""

    name: str
    passed: bool
    blocking: bool
    description: str
    detail: dict[str, Any] = field(default_factory=dict)
    applicable: bool = True


def _read_json(path: Path) -> Any:
    try:
        return read_receipt(path)
    except (OSError, ValueError):
        return None


def _meta(leg: Path) -> dict[str, Any]:
    meta = _read_json(leg / LEG_FILE)
    return meta if isinstance(meta, dict) else {}


# ---------------------------------------------------------------------------- canaries


# (item, question hash, the runner, what the judging code is now) -> its canaries' results. A
# canary's outcome is a function of the frozen question and the code that builds and judges its
# receipts; a track's materialization asks for it once per item and a process (Dagster's
# in-process executor, the test suite) asks again for every track it materializes.
_CANARY_RESULTS: dict[tuple, list] = {}
# What builds canaries, beside every module a judge's verdict depends on (tica.judging's
# judge_sources(), the files JUDGE_VERSION hashes): one list, so a module that joins the judging
# code joins it here too.
_CANARY_BUILDERS = ("tica.canaries", "tica.canary_legs", "tica.items")


@functools.cache
def judging_modules() -> frozenset[str]:
    from tica.judging import judge_sources

    root = Path(__file__).resolve().parent
    names = {".".join(("tica", *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
             for p in judge_sources()}
    return frozenset(names)


def _judging_code() -> int:
    """Changes when any attribute of a module that builds or judges canaries is rebound (a
    monkeypatched judge or reader must never be answered from a run of the real one)."""
    import sys

    judged = judging_modules()
    mods = [m for name, m in sorted(sys.modules.items())
            if m is not None and (name in judged or name.startswith(_CANARY_BUILDERS))]
    return hash(tuple(id(v) for m in mods for v in vars(m).values()))


def canaries(item: EvidenceItem, question: Question,
             run: Callable[..., Sequence[Any]] | None = None) -> CheckOutcome:
    """Every canary of the item's criteria under this frozen question returned fail; the ones
    the question switches off are listed with the reason, one by one."""
    if run is None:
        from tica.canaries import run_canaries as run
    key = (item, question.hash, run, _judging_code())
    if key not in _CANARY_RESULTS:
        if len(_CANARY_RESULTS) >= 256:  # a long-lived process: bounded, never stale (the key says what ran)
            _CANARY_RESULTS.clear()
        _CANARY_RESULTS[key] = [r for r in run(questions={item: question}, only=[f"{item.value}."])
                                if r.item == item.value]
    results = _CANARY_RESULTS[key]
    rows = [{"canary": r.name, "rule": r.rule, "expected": list(r.expected), "got": r.got,
             "caught": not r.broken and not r.not_applicable, "off": r.not_applicable, "detail": r.detail}
            for r in results]
    detail = {"question_hash": question.hash, "canaries": rows,
              "switched_off": {r.name: r.detail for r in results if r.not_applicable}}
    if not results:
        return CheckOutcome(CANARIES, False, True, f"no canary for {question.name} ({item.value}): "
                            "a criterion never shown to fail blocks acceptance", detail)
    missed = [r for r in results if r.broken]
    off = [r for r in results if r.not_applicable]
    if missed and all(r.got.startswith("baseline") for r in missed):
        # The question's own passing receipt set cannot pass under it (a report-only throughput
        # question, say): no criterion can be shown to flip a pass, and no cell under it passes.
        # Recorded as failed (acceptance stays blocked); not an integrity fault that stops a run.
        return CheckOutcome(CANARIES, False, True, f"{len(missed)} canary(ies) cannot run: under this question no "
                            "receipt set passes, so no criterion can be shown to fail a pass and the cell cannot be "
                            f"accepted; {clip(relative(without_prefix(missed[0].detail)), 240)}", detail,
                            applicable=False)
    if missed:
        return CheckOutcome(CANARIES, False, True, f"{len(missed)} canary(ies) not caught: "
                            + ", ".join(f"{r.name} (got {r.got})" for r in missed), detail)
    text = f"{len(results) - len(off)} canaries all caught"
    if off:
        text += "; switched off by the question: " + "; ".join(f"{r.name}: {r.detail}" for r in off)
    return CheckOutcome(CANARIES, True, True, text, detail)


# ---------------------------------------------------------------------------- receipts


def receipts(legs: Sequence[Path], recorded: dict[str, list[dict[str, str]]]) -> CheckOutcome:
    """Every judged leg matches its seal, and every time the ledger recorded it, its files'
    hashes are the sealed ones. A judged leg the ledger never recorded is no evidence."""
    problems: list[str] = []
    for leg in legs:
        problems += [in_leg(p, leg) for p in check_seal(leg)]
        seal = (_read_json(leg / SEAL_FILE) or {}).get("files", {})
        records = recorded.get(str(leg))
        if not records:
            problems.append(f"{leg.name}: judged but never recorded in the ledger")
            continue
        for files in records:
            for rel, recorded_digest in files.items():
                if seal.get(rel) != recorded_digest:
                    problems.append(f"{leg.name}/{rel}: seal says {digest(seal.get(rel))}, the ledger "
                                    f"recorded {digest(recorded_digest)}")
            # a file the seal now holds that a recording of this leg did not: added after the ledger saw it
            for rel in sorted(set(seal) - set(files)):
                problems.append(f"{leg.name}/{rel}: sealed now, but not in the leg when the ledger "
                                "recorded it (added after; a leg is never changed in place)")
    text = f"{len(legs)} leg(s) sealed and as recorded" if not problems else f"{len(problems)} problem(s): {problems[0]}"
    return CheckOutcome(RECEIPTS, not problems, True, text, {"problems": problems, "legs": len(legs)})


# ---------------------------------------------------------------------------- frozen before run


def _when(value: Any) -> _dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        t = _dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return t if t.tzinfo is not None else None


def frozen_before_run(frozen_at: str | None, legs: Sequence[Path], proven: Mapping[Path, tuple[str, str]] | None = None,
                      proof_problems: Mapping[Path, str] | None = None) -> CheckOutcome:
    """The question was frozen (its first ledger row) before any judged leg started. A leg whose
    start is unknown cannot show that, and a verdict judged after the fact is never accepted.

    `proven`: per run folder (a leg's parent), an earlier freeze shown by the signed chain that
    travels with that run (tica.order_proof): (time, what proves it). It can only make a freeze
    earlier for that run's legs; `proof_problems` say why a run's proof did not hold.

    Both times a producer writes are read: the work start in leg.json and the seal's own time.
    A leg sealed before the freeze, or "started" after it was sealed, was not run under this
    question. A leg whose work never began (a not_run_reason, no start and no end: it holds no
    measurement, and every judge reads it as not run) is placed by its seal alone: sealed after the
    freeze, it was written under the question. (Both are the producer's clock: a producer that
    forges both is beyond any check of its own receipts; the ledger's legs rows record when TICA
    first saw each leg.)"""
    proven = proven or {}
    frozen = _when(frozen_at)
    late, unknown, by_proof = [], [], {}
    for leg in legs:
        meta = _meta(leg)
        sealed = _when((_read_json(leg / SEAL_FILE) or {}).get("sealed_at"))
        never_began = bool(meta.get("not_run_reason")) and meta.get("started_at") is None and meta.get("ended_at") is None
        started = sealed if never_began else _when(meta.get("started_at"))
        shown = proven.get(Path(leg).parent)
        times = [t for t in (frozen, _when(shown[0]) if shown else None) if t is not None]
        freeze = min(times) if times else None
        if shown and freeze == _when(shown[0]) and freeze != frozen:
            by_proof[leg.name] = shown[1]
        if started is None or sealed is None:
            unknown.append(leg.name)
        elif sealed < started:
            late.append(f"{leg.name} claims to start at {started.isoformat()}, after it was sealed at {sealed.isoformat()}")
        elif freeze is not None and started < freeze:
            late.append(f"{leg.name} started {started.isoformat()}")
        elif freeze is None:
            unknown.append(leg.name)
    problems = sorted(set((proof_problems or {}).values()))
    detail = {"frozen_at": frozen_at, "started_before_freeze": late, "start_unknown": unknown,
              "proven_by": sorted(set(by_proof.values())), "proof_problems": problems}
    if frozen is None and not by_proof:
        text = "the question's freeze time is not in the ledger"
        return CheckOutcome(FROZEN, False, True, text + (f", and the proof with the receipts does not hold: {problems[0]}"
                                                         if problems else ""), detail)
    if late or unknown:
        parts = []
        if late:
            when = frozen or min(_when(t) for t, _ in proven.values())
            parts.append(f"judged after the fact: the question was frozen at {when.isoformat()}, after "
                         f"{len(late)} leg(s) had started ({late[0]})")
        if unknown:
            parts.append(f"{len(unknown)} leg(s) record no start or seal time with a time zone, or no freeze applies "
                         f"to them ({unknown[0]}): freezing before them cannot be shown")
        if problems:
            parts.append(f"the proof with the receipts does not hold ({problems[0]})")
        return CheckOutcome(FROZEN, False, True, "; ".join(parts), detail)
    if by_proof:
        return CheckOutcome(FROZEN, True, True, f"frozen before all {len(legs)} leg(s) started, as "
                            f"{sorted(set(by_proof.values()))[0]} shows", detail)
    return CheckOutcome(FROZEN, True, True, f"frozen at {frozen.isoformat()}, before all {len(legs)} leg(s) started",
                        detail)


# ---------------------------------------------------------------------------- quality sums


def recount_quality(legs: Sequence[Path]) -> tuple[dict[str, int], list[str]]:
    """The 2x2 counted again from the legs' results.jsonl, independently of the judge."""
    by_arm: dict[str, dict[str, bool]] = {}
    problems: list[str] = []
    for leg in legs:
        meta = _meta(leg)
        if meta.get("item") != "quality" or meta.get("not_run_reason"):
            continue
        arm = str(meta.get("arm"))
        seen: dict[str, bool] = {}
        try:
            lines = strict_io.lines_of(strict_io.text_of(strict_io.regular_file_bytes(leg / RESULTS_FILE)))
        except (OSError, ValueError) as err:
            problems.append(f"{leg.name}: {RESULTS_FILE} unreadable: {relative(str(err))}")
            continue
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                r = strict_io.loads(line)
            except ValueError:
                r = None
            if not isinstance(r, dict):
                problems.append(f"{leg.name}: {RESULTS_FILE} line {n} is not a JSON object")
                continue
            pid = str(r.get("problem_id"))
            if pid in seen:
                problems.append(f"{leg.name}: problem {pid} appears twice")
            seen[pid] = r.get("correct") is True
        if arm in by_arm:
            problems.append(f"two quality legs for arm {arm}")
        by_arm[arm] = seen
    if set(by_arm) != {"bi1", "bi0"}:
        problems.append(f"quality results for arms {sorted(by_arm)}: pairing needs bi1 and bi0")
        return {}, problems
    a, b = by_arm["bi1"], by_arm["bi0"]
    if set(a) != set(b):
        problems.append(f"problem ids differ between the arms: {len(set(a) ^ set(b))} not paired")
    ids = set(a) | set(b)
    counts = {"both_correct": sum(a.get(i, False) and b.get(i, False) for i in ids),
              "only_bi0": sum(b.get(i, False) and not a.get(i, False) for i in ids),
              "only_bi1": sum(a.get(i, False) and not b.get(i, False) for i in ids),
              "both_wrong": sum(not a.get(i, False) and not b.get(i, False) for i in ids),
              "n": len(ids)}
    return counts, problems


def quality_sums(cell: VerdictCell, question: Question, legs: Sequence[Path]) -> CheckOutcome:
    """both_correct + only_bi0 + only_bi1 + both_wrong = N, recounted from the receipts and
    compared with what the judge reported and the N the question froze."""
    if cell.verdict in (Verdict.NOT_RUN,):
        return CheckOutcome(QUALITY_SUMS, False, True, "nothing to sum: the quality pairing did not run",
                            applicable=False)
    counts, problems = recount_quality(legs)
    keys = ("both_correct", "only_bi0", "only_bi1", "both_wrong", "n")
    judged = {k: cell.numbers.get(k) for k in keys}
    if counts:
        if sum(counts[k] for k in keys[:4]) != counts["n"]:
            problems.append(f"recounted cells sum to {sum(counts[k] for k in keys[:4])}, not N = {counts['n']}")
        if judged != counts:
            problems.append(f"the judge reported {judged}, the receipts recount to {counts}")
        want = question.criteria.expected_problems if isinstance(question.criteria, QualityCriteria) else None
        if want is not None and counts["n"] != want:
            problems.append(f"N = {counts['n']} paired problems, the question froze {want}")
    text = (f"{counts['both_correct']} + {counts['only_bi0']} + {counts['only_bi1']} + {counts['both_wrong']} = "
            f"{counts['n']}, as judged") if not problems else problems[0]
    return CheckOutcome(QUALITY_SUMS, not problems, True, text, {"recount": counts, "judged": judged,
                                                                  "problems": problems})


# ---------------------------------------------------------------------------- workload


def workload(legs: Sequence[Path], manifest_workload: Any, question: Question) -> CheckOutcome:
    """Each throughput leg against the candidate's fixed-length workload (the manifest's: its
    concurrencies and requests per leg; a question asking for other counts judges another
    workload). Blocking: a cell whose legs ran another workload is not evidence for this one."""
    criteria = question.criteria
    problems: list[str] = []
    if isinstance(criteria, ThroughputCriteria):
        uncovered = sorted(set(manifest_workload.concurrencies) - set(criteria.concurrencies))
        if uncovered:
            problems.append(f"the question judges c={list(criteria.concurrencies)}; the candidate's workload also "
                            f"pins c={uncovered}, which no criterion measures")
    for leg in legs:
        meta = _meta(leg)
        if meta.get("not_run_reason"):
            continue
        bench = _read_json(leg / "bench.json")
        if not isinstance(bench, dict):
            problems.append(f"{leg.name}: no readable bench.json")
            continue
        cfg = meta.get("resolved_config") or {}
        for name in ("input_len", "output_len", "ignore_eos"):
            if name in cfg and cfg[name] != getattr(manifest_workload, name):
                problems.append(f"{leg.name}: resolved_config.{name} = {cfg[name]!r}, the workload says "
                                f"{getattr(manifest_workload, name)!r}")
        conc = meta.get("concurrency")
        expected = manifest_workload.prompts_at(conc) if isinstance(conc, int) else None
        completed = bench.get("completed", 0)
        if expected is None:
            problems.append(f"{leg.name}: concurrency {conc!r} is not one of the workload's "
                            f"{list(manifest_workload.concurrencies)}")
        elif completed != expected:
            problems.append(f"{leg.name}: completed {completed} of {expected} requests")
        if bench.get("failed", 0):
            problems.append(f"{leg.name}: {bench['failed']} failed request(s)")
        if conc is not None and bench.get("max_concurrency") not in (None, conc):
            problems.append(f"{leg.name}: max_concurrency {bench.get('max_concurrency')} != leg concurrency {conc}")
        if manifest_workload.ignore_eos and completed:
            for name, per in (("total_input_tokens", manifest_workload.input_len),
                              ("total_output_tokens", manifest_workload.output_len)):
                if name in bench and bench[name] != per * completed:
                    problems.append(f"{leg.name}: {name} {bench[name]} != {per} x {completed}")
    text = "every leg matches the workload" if not problems else f"{len(problems)} mismatch(es): {problems[0]}"
    return CheckOutcome(WORKLOAD, not problems, True, text, {"mismatches": problems})
