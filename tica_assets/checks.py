"""Asset checks on the evidence: canaries, receipt integrity, workload receipts, quality sums.

Blocking (ERROR) where acceptance depends on it: a criterion never shown to fail, a receipt
that changed after sealing or disagrees with the ledger, quality counts that do not add up.
A workload mismatch warns: the throughput judge already marks such a leg `inconclusive`.
"""

from __future__ import annotations

from pathlib import Path

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    Definitions,
    MetadataValue,
    asset_check,
)

from tica.errors import FrozenQuestionError
from tica.evidence import EvidenceItem
from tica.records import frozen_question
from tica.seal import check_seal
from tica_assets import core
from tica_assets.candidates import load_track
from tica_assets.keys import evidence_key
from tica_assets.settings import Settings
from tica_assets.tracks import Track

E = EvidenceItem


def latest_metadata(context: AssetCheckExecutionContext, key: AssetKey) -> dict | None:
    event = context.instance.get_latest_materialization_event(key)
    mat = event.asset_materialization if event else None
    return dict(mat.metadata) if mat else None


def _legs(meta: dict) -> list[Path]:
    return [Path(p) for p in meta["leg_dirs"].value] if "leg_dirs" in meta else []


def _missing(key: AssetKey) -> AssetCheckResult:
    return AssetCheckResult(passed=False, severity=AssetCheckSeverity.ERROR,
                            description=f"{key.to_user_string()} has not been materialized")


# ---------------------------------------------------------------------------- canaries


def canary_result(item: EvidenceItem, question) -> AssetCheckResult:
    outcomes = core.run_canaries(item, question)
    if not outcomes:
        return AssetCheckResult(
            passed=False, severity=AssetCheckSeverity.ERROR,
            description=f"no canary for {question.name} ({item.value}): a criterion never shown to fail blocks acceptance",
            metadata={"question_hash": question.hash},
        )
    missed = [o for o in outcomes if not o.caught]
    off = [o for o in outcomes if not o.applicable]
    table = "\n".join(
        ["| canary | caught | detail |", "| --- | --- | --- |"]
        + [f"| {o.name} | {'n/a' if not o.applicable else 'yes' if o.caught else '**no**'} | {o.detail} |"
           for o in outcomes]
    )
    if missed:
        description = f"{len(missed)} canary(ies) not caught: {', '.join(o.name for o in missed)}"
    else:
        description = f"{len(outcomes) - len(off)} canaries all returned fail"
        if off:
            description += f"; {len(off)} not applicable (criterion switched off by the question: {off[0].detail})"
    return AssetCheckResult(
        passed=not missed, severity=AssetCheckSeverity.ERROR,
        description=description,
        metadata={"canaries": MetadataValue.md(table), "question_hash": question.hash},
    )


def canary_check(track: Track, item: EvidenceItem):
    key = evidence_key(track.name, item)

    @asset_check(asset=key, name="canaries_caught", blocking=True, required_resource_keys={"ledger"},
                 description="every criterion of the frozen question returns fail on its planted error")
    def _check(context) -> AssetCheckResult:
        meta = latest_metadata(context, key)
        if meta is None:
            return _missing(key)
        try:
            question = frozen_question(context.resources.ledger.ledger(), meta["question_hash"].value)
        except FrozenQuestionError as err:
            return AssetCheckResult(passed=False, severity=AssetCheckSeverity.ERROR, description=str(err))
        return canary_result(item, question)

    return _check


# ---------------------------------------------------------------------------- receipts


def receipt_problems(legs: list[Path], recorded: dict[str, dict[str, str]]) -> list[str]:
    """Seal problems, plus any sealed file whose hash differs from what the ledger recorded."""
    problems: list[str] = []
    for leg in legs:
        problems += check_seal(leg)
        seal = core.read_json(leg / "seal.json") or {}
        for rel, digest in (recorded.get(str(leg)) or {}).items():
            if seal.get("files", {}).get(rel) != digest:
                problems.append(f"{leg / rel}: seal says {str(seal.get('files', {}).get(rel))[:12]}, ledger recorded {digest[:12]}")
    return problems


def receipts_check(track: Track, item: EvidenceItem):
    key = evidence_key(track.name, item)

    @asset_check(asset=key, name="receipts_sealed", blocking=True, required_resource_keys={"ledger"},
                 description="every judged receipt matches its seal and the hashes the ledger recorded")
    def _check(context) -> AssetCheckResult:
        meta = latest_metadata(context, key)
        if meta is None:
            return _missing(key)
        legs = _legs(meta)
        rows = context.resources.ledger.ledger().rows(
            "SELECT l.leg_dir, r.path, r.sha256 FROM legs l JOIN receipts r USING (leg_id) "
            "WHERE l.candidate_id = ? AND l.item = ?",
            [meta["candidate_id"].value, item.value],
        )
        recorded: dict[str, dict[str, str]] = {}
        for r in rows:
            recorded.setdefault(r["leg_dir"], {})[r["path"]] = r["sha256"]
        problems = receipt_problems(legs, recorded)
        return AssetCheckResult(
            passed=not problems, severity=AssetCheckSeverity.ERROR,
            description=f"{len(legs)} leg(s) verified" if not problems else f"{len(problems)} problem(s): {problems[0]}",
            metadata={"problems": MetadataValue.md("\n".join(f"- {p}" for p in problems) or "_none_"),
                      "legs": len(legs)},
        )

    return _check


# ---------------------------------------------------------------------------- workload


def workload_problems(legs: list[Path], workload, num_prompts: dict[int, int] | None = None) -> list[str]:
    """Each leg against the manifest's fixed-length workload; the request count per concurrency
    is the frozen question's where it names one, else the manifest's."""
    problems: list[str] = []
    for leg in legs:
        meta = core.leg_meta(leg)
        if meta.get("not_run_reason"):
            continue
        bench = core.read_json(leg / "bench.json")
        if bench is None:
            problems.append(f"{leg}: no readable bench.json")
            continue
        cfg = meta.get("resolved_config", {})
        for field in ("input_len", "output_len", "ignore_eos"):
            if field in cfg and cfg[field] != getattr(workload, field):
                problems.append(f"{leg.name}: resolved_config.{field} = {cfg[field]!r}, workload says {getattr(workload, field)!r}")
        conc = meta.get("concurrency")
        expected = (num_prompts or {}).get(conc, workload.num_prompts)
        completed = bench.get("completed", 0)
        if completed != expected:
            problems.append(f"{leg.name}: completed {completed} of {expected} requests")
        if bench.get("failed", 0):
            problems.append(f"{leg.name}: {bench['failed']} failed request(s)")
        if conc is not None and bench.get("max_concurrency") not in (None, conc):
            problems.append(f"{leg.name}: max_concurrency {bench.get('max_concurrency')} != leg concurrency {conc}")
        if workload.ignore_eos and completed:
            for field, per in (("total_input_tokens", workload.input_len), ("total_output_tokens", workload.output_len)):
                if field in bench and bench[field] != per * completed:
                    problems.append(f"{leg.name}: {field} {bench[field]} != {per} x {completed}")
    return problems


def workload_check(track: Track, settings: Settings):
    key = evidence_key(track.name, E.THROUGHPUT)

    @asset_check(asset=key, name="workload_receipts", blocking=False, required_resource_keys={"ledger"},
                 description="each throughput leg ran the fixed-length workload the manifest names")
    def _check(context) -> AssetCheckResult:
        meta = latest_metadata(context, key)
        if meta is None:
            return _missing(key)
        loaded, _ = load_track(track, settings)
        question = frozen_question(context.resources.ledger.ledger(), meta["question_hash"].value)
        per_c = getattr(question.criteria, "num_prompts", None)
        problems = workload_problems(_legs(meta), loaded.manifest.workload, dict(per_c) if per_c else None)
        return AssetCheckResult(
            passed=not problems, severity=AssetCheckSeverity.WARN,
            description="every leg matches the workload" if not problems else f"{len(problems)} mismatch(es): {problems[0]}",
            metadata={"mismatches": MetadataValue.md("\n".join(f"- {p}" for p in problems) or "_none_")},
        )

    return _check


# ---------------------------------------------------------------------------- quality sums


def quality_counts(legs: list[Path]) -> tuple[dict[str, int], list[str]]:
    by_arm: dict[str, dict[str, bool]] = {}
    problems: list[str] = []
    for leg in legs:
        arm = core.leg_meta(leg).get("arm")
        rows = core.read_jsonl(leg / "results.jsonl")
        seen: dict[str, bool] = {}
        for r in rows:
            pid = r.get("problem_id")
            if pid in seen:
                problems.append(f"{leg.name}: problem {pid} appears twice")
            seen[pid] = bool(r.get("correct"))
        if arm in by_arm:
            problems.append(f"two quality legs for arm {arm}")
        by_arm[arm] = seen
    if set(by_arm) != {"bi1", "bi0"}:
        problems.append(f"quality legs for arms {sorted(map(str, by_arm))}, need bi1 and bi0")
        return {}, problems
    a, b = by_arm["bi1"], by_arm["bi0"]
    if set(a) != set(b):
        problems.append(f"problem ids differ between arms: {len(set(a) ^ set(b))} not paired")
    ids = set(a) & set(b)
    counts = {
        "both_correct": sum(a[i] and b[i] for i in ids),
        "only_bi0": sum(b[i] and not a[i] for i in ids),
        "only_bi1": sum(a[i] and not b[i] for i in ids),
        "both_wrong": sum(not a[i] and not b[i] for i in ids),
        "N": len(ids),
    }
    if sum(v for k, v in counts.items() if k != "N") != counts["N"]:
        problems.append(f"counts {counts} do not sum to N")
    return counts, problems


def quality_check(track: Track):
    key = evidence_key(track.name, E.QUALITY)

    @asset_check(asset=key, name="quality_sums", blocking=True,
                 description="both_correct + only_bi0 + only_bi1 + both_wrong = N over the same problem ids")
    def _check(context) -> AssetCheckResult:
        meta = latest_metadata(context, key)
        if meta is None:
            return _missing(key)
        all_legs = _legs(meta)
        legs = [leg for leg in all_legs if not core.leg_meta(leg).get("not_run_reason")]
        if len(legs) < len(all_legs) or not legs:
            # An arm did not run: the cell says `not run`; there is no pairing whose sum could be wrong.
            return AssetCheckResult(passed=True, description="an arm's quality leg did not run: no pairing to sum; "
                                    "the cell is not run")
        counts, problems = quality_counts(legs)
        return AssetCheckResult(
            passed=not problems, severity=AssetCheckSeverity.ERROR,
            description=(f"{counts['both_correct']} + {counts['only_bi0']} + {counts['only_bi1']} + "
                         f"{counts['both_wrong']} = {counts['N']}") if not problems else problems[0],
            metadata={k: v for k, v in counts.items()},
        )

    return _check


def check_defs(track: Track, settings: Settings) -> Definitions:
    checks = [canary_check(track, item) for item in EvidenceItem]
    checks += [receipts_check(track, item) for item in EvidenceItem if item is not E.ARTIFACTS]
    checks += [workload_check(track, settings), quality_check(track)]
    return Definitions(asset_checks=checks)


