"""Final immutable artifacts: every receipt sealed and unchanged, weights named by content hash."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tica.errors import ReceiptError
from tica import digests
from tica.evidence import EvidenceItem
from tica.judging import Findings, cell, led, md_table, wrong_question_cell
from tica.confounders import require_recorded
from tica.items.artifacts.criteria import ArtifactsCriteria
from tica.messages import digest, in_leg
from tica.question import Question
from tica.receipts import LEG_FILE, METRICS_FILE, load_jsonl, load_leg_meta
from tica.seal import check_seal, seal_digest
from tica.verdict import VerdictCell

CONTENT_HASH = re.compile(r"^(blake3|sha256|xxh3|xxh3-128|xxh128):[0-9a-f]{16,}$")


def judge_artifacts(question: Question, leg_paths: Sequence[str | Path]) -> VerdictCell:
    item = EvidenceItem.ARTIFACTS
    if (wrong := wrong_question_cell(item, question)) is not None:
        return wrong
    findings = Findings()
    criteria: ArtifactsCriteria = question.criteria  # type: ignore[assignment]
    rows: list[list[Any]] = []
    hashes: dict[str, str] = {}
    weights: dict[str, set[str]] = {}
    for raw in leg_paths:
        path = Path(raw)
        if not path.is_dir():
            findings.fail(f"{path.name}: not a sealed leg directory")
            rows.append([str(path), "no seal", None, "fail"])
            continue
        problems = check_seal(path)
        if problems:
            problems = [in_leg(p, path) for p in problems]
            for p in problems:
                findings.fail(p)
            rows.append([path.name, "; ".join(problems), None, "fail"])
            continue
        hashes[str(path)] = seal_digest(path)
        try:
            meta = load_leg_meta(path / LEG_FILE)
        except ReceiptError as err:
            findings.inconclusive(str(err))
            rows.append([path.name, "sealed", None, "inconclusive"])
            continue
        if not meta.not_run_reason:
            require_recorded(findings, question, [(path.name, meta)])
        named = meta.resolved_config.get("weights_hash")
        status = "pass"
        if named is None:
            if criteria.require_weights_hash and not meta.not_run_reason:
                findings.inconclusive(f"{path.name}: resolved_config.weights_hash not recorded")
                status = "inconclusive"
        elif not CONTENT_HASH.match(digests.canonical(str(named))):
            if criteria.require_weights_hash:
                findings.fail(f"{path.name}: weights named {named!r}, not by a content hash")
                status = "fail"
        elif not meta.not_run_reason:  # a leg that did not run produced nothing: it names no artifact
            weights.setdefault(digests.canonical(str(named)), set()).add(path.name)
        if meta.item == "update" and (path / METRICS_FILE).is_file():
            for row in load_jsonl(path / METRICS_FILE):
                h = row.get("updated_weights_hash")
                if h is not None and not CONTENT_HASH.match(digests.canonical(str(h))):
                    findings.fail(f"{path.name}: updated weights named {h!r}, not by a content hash")
                    status = "fail"
        rows.append([path.name, "sealed", named, status])
    if len(weights) > 1:
        findings.fail("legs of one candidate name different weights: "
                      + "; ".join(f"{h}: {sorted(v)}" for h, v in sorted(weights.items())))
    if not leg_paths:
        findings.not_run("no receipts")
    elif criteria.require_weights_hash and not weights:
        # Sealed records of legs that did not run name no artifact: the weights were never named.
        findings.not_run("no judged leg ran and named its weights by a content hash: no artifact to seal")
    numbers = {"legs": [dict(zip(["leg", "seal", "weights_hash", "status"], r)) for r in rows],
               "weights": sorted(weights)}
    tables = {"receipts": md_table(["leg", "seal", "weights", "status"], rows)}
    named = ", ".join(digest(w) for w in sorted(weights)) or "unnamed"
    summary = led(findings, f"{len(hashes)} of {len(leg_paths)} receipts sealed and intact; weights {named}")
    return cell(item, question, findings, summary, numbers, tables, hashes)
