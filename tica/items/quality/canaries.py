"""Quality's canaries: a passing receipt set (both arms scored on the same 30 problems under one
evaluation contract, one problem flipped each way so the scores are equal and the per-problem
results are not) and one planted error per rule, each of which the judge must not pass.
`tica.canaries` runs them with every other item's."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tica.canary_legs import FAIL, INCONCLUSIVE, Canary, edit_json, edit_jsonl, find_leg, jsonl, leg_meta, proc
from tica.canary_legs import unquantified_confounder, write_leg
from tica.evidence import EvidenceItem
from tica.items.quality.criteria import QualityCriteria
from tica.question import Question

E = EvidenceItem

# The question the built-in canaries and the committed fixtures are judged under.
QUESTION: dict[str, Any] = {
    "name": "gsm8k-30-greedy", "compared": "accuracy per problem", "computation": "paired 2x2",
    "pass_line": "|score diff| <= 3.34 points",
    "criteria": {"item": "quality", "threshold_points": 3.34, "expected_problems": 30}}


def contract() -> dict[str, Any]:
    """The evaluation contract both arms of the passing set record (contract.json)."""
    return {"dataset_version": "openai/gsm8k@main:test[:30] sha256:3f1c2a", "prompt_template":
            "qwen3-chat sha256:9b1e", "thinking_mode": "off",
            "sampling": {"temperature": 0, "top_p": 1, "top_k": -1, "seed": 0, "n": 1, "stop": []},
            "repeats": 1, "scorer": "tica.scorer.boxed/1 sha256:77aa", "length_cap": 1024}


def build_quality(question: Question, dest: Path) -> list[Path]:
    c: QualityCriteria = question.criteria  # type: ignore[assignment]
    n = c.expected_problems or 30
    rng = np.random.default_rng(7)
    base = rng.random(n) < 0.8
    # One problem flips each way: the scores are equal, the per-problem results are not.
    right = np.flatnonzero(base)
    flips = {"bi1": {int(right[0])}, "bi0": {int(right[1])}}
    legs = []
    for arm in ("bi1", "bi0"):
        rows = []
        for i in range(n):
            correct = bool(base[i]) != (i in flips[arm])
            rows.append({"problem_id": f"gsm8k-test-{i:04d}", "correct": correct,
                         "prompt_hash": f"sha256:{i:064x}", "response": f"... so the answer is \\boxed{{{i * 7}}}",
                         "extracted": str(i * 7 if correct else i * 7 + 1), "truncated": i == 11})
        meta = leg_meta("quality", arm, processes=[proc("client", 7100), proc("engine_core", 7101)])
        legs.append(write_leg(dest / f"quality_{arm}", meta, {"results.jsonl": jsonl(rows),
                                                              "contract.json": json.dumps(contract(), indent=1)}))
    return legs


def drop_problem(legs: Sequence[Path]) -> None:
    """The BI=0 arm's last problem left out: the 2x2 no longer sums to N."""
    leg = find_leg(legs, arm="bi0")
    edit_jsonl(leg / "results.jsonl", lambda rows: rows[:-1], leg)


def over_threshold(q: Question, legs: Sequence[Path]) -> None:
    """BI=1 wrong on one problem more than the threshold allows."""
    crit: QualityCriteria = q.criteria  # type: ignore[assignment]
    leg = find_leg(legs, arm="bi1")
    n = len((leg / "results.jsonl").read_text().splitlines())
    k = int(math.floor(crit.threshold_points * n / 100)) + 1

    def flip(rows: list[dict[str, Any]]) -> None:
        done = 0
        for row in rows:
            if row["correct"] and done < k:
                row["correct"], done = False, done + 1
    edit_jsonl(leg / "results.jsonl", flip, leg)


def contract_item(key: str, value: Any) -> Callable[[Question, list[Path]], None]:
    """The BI=0 arm's contract with one item (`sampling.<k>` for a sampling parameter) set to `value`."""
    def mutate(q: Question, legs: list[Path]) -> None:
        leg = find_leg(legs, arm="bi0")
        def f(d: dict[str, Any]) -> None:
            if key.startswith("sampling."):
                d["sampling"][key.split(".", 1)[1]] = value
            else:
                d[key] = value
        edit_json(leg / "contract.json", f, leg)
    return mutate


def sampling_unrecorded(q: Question, legs: Sequence[Path]) -> None:
    """Neither arm's contract records its stop tokens: unknown, never vLLM's default."""
    for leg in legs:
        if (leg / "contract.json").is_file():
            edit_json(leg / "contract.json", lambda d: d["sampling"].pop("stop", None), leg)


# The must_record canary every item has is tica.canaries' (it reads the question, not the item).
CANARIES: tuple[Canary, ...] = (
    *(Canary(f"quality.contract.{name}", E.QUALITY, f"contract item '{name}' matches", INCONCLUSIVE,
             contract_item(key, value)) for name, key, value in (
        ("dataset_version", "dataset_version", "openai/gsm8k@main:test[:30] sha256:0000"),
        ("template_thinking", "thinking_mode", "on"),
        ("sampling", "sampling.top_p", 0.95),
        ("repeats", "repeats", 2),
        ("scorer", "scorer", "verl.gsm8k/2 sha256:0bb1"),
        ("length_cap", "length_cap", 4096))),
    Canary("quality.contract.sampling_unrecorded", E.QUALITY, "an unrecorded sampling parameter is unknown, not a "
           "default", INCONCLUSIVE, sampling_unrecorded),
    Canary("quality.pairing_sums_to_n", E.QUALITY, "both_correct+only_bi0+only_bi1+both_wrong = N", INCONCLUSIVE,
           lambda q, legs: drop_problem(legs)),
    Canary("quality.no_retries", E.QUALITY, "no retries", INCONCLUSIVE,
           lambda q, legs: edit_jsonl(find_leg(legs, arm="bi1") / "results.jsonl",
                                      lambda rows: rows + [dict(rows[0], correct=not rows[0]["correct"])],
                                      find_leg(legs, arm="bi1"))),
    Canary("quality.threshold", E.QUALITY, "|score difference| within the threshold", FAIL, over_threshold),
    Canary("quality.confounder", E.QUALITY, "no delta attributed under an unquantified confounder", INCONCLUSIVE,
           lambda q, legs: unquantified_confounder(q, legs, "quality")),
)
