"""Bad input is a clear error naming the file and field, never a silent reading (issue 11):
duplicate keys, FIFOs, symlinked folders, non-finite numbers, out-of-range rounds."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import yaml

from tica.canaries import build_clean_exit, default_questions, edit_meta
from tica.errors import QuestionError, ReceiptError
from tica.evidence import EvidenceItem
from tica.judges import judge_criteria
from tica.question import load_question
from tica.receipts import load_leg, load_step_arrays
from tica.seal import check_seal, seal_leg
from tica.verdict import Verdict

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "receipts"
Q = default_questions()


@pytest.fixture
def exit_legs(tmp_path) -> list[Path]:
    return build_clean_exit(Q[EvidenceItem.CLEAN_EXIT], tmp_path)


def test_a_duplicate_key_is_refused_not_read_last_wins(exit_legs):
    """A leg.json whose first `processes` is force-killed and whose second is clean must not
    read as clean."""
    leg = exit_legs[0]
    meta = json.loads((leg / "leg.json").read_text())
    killed = [dict(p, end_state="force_killed") for p in meta["processes"]]
    text = json.dumps(meta, indent=1)
    text = text.replace('"processes": [', '"processes": ' + json.dumps(killed) + ', "processes": [', 1)
    (leg / "leg.json").write_text(text)
    seal_leg(leg)
    with pytest.raises(ReceiptError, match="duplicate key 'processes'"):
        load_leg(leg)
    cell = judge_criteria("clean_exit", Q[EvidenceItem.CLEAN_EXIT], exit_legs)
    assert cell.verdict is not Verdict.PASS


def test_a_fifo_receipt_is_refused_without_hanging(tmp_path):
    legs = shutil.copytree(FIX / "forward", tmp_path / "forward")
    leg = next(p for p in legs.iterdir() if (p / "metrics.jsonl").is_file())
    (leg / "metrics.jsonl").unlink()
    os.mkfifo(leg / "metrics.jsonl")
    signal.alarm(20)  # a hang fails the test instead of the suite
    try:
        cell = judge_criteria("forward", load_question(FIX / "questions" / "forward.yaml"), [leg])
    finally:
        signal.alarm(0)
    assert cell.verdict is not Verdict.PASS


def test_a_symlinked_folder_inside_a_leg_is_not_sealed_by_content(tmp_path):
    legs = shutil.copytree(FIX / "forward", tmp_path / "forward")
    leg = next(p for p in legs.iterdir() if (p / "arrays").is_dir())
    outside = tmp_path / "outside"
    shutil.move(str(leg / "arrays"), outside)
    (leg / "arrays").symlink_to(outside, target_is_directory=True)
    seal_leg(leg)
    assert any("symlink" in p for p in check_seal(leg))


def test_non_finite_logprobs_on_both_sides_are_no_measurement(tmp_path):
    legs = shutil.copytree(FIX / "forward", tmp_path / "forward")
    leg = next(p for p in legs.iterdir() if (p / "arrays").is_dir())
    npz = sorted((leg / "arrays").glob("*.npz"))[0]
    with np.load(npz) as z:
        data = {k: z[k] for k in z.files}
    data["trainer_logprobs"][0] = data["rollout_logprobs"][0] = -np.inf
    np.savez(npz, **data)
    with pytest.raises(ReceiptError, match="non-finite logprob"):
        load_step_arrays(npz)


@pytest.mark.parametrize("budget", [".nan", ".inf"])
def test_a_question_with_a_non_finite_budget_is_refused(tmp_path, budget):
    q = yaml.safe_load((FIX / "questions" / "throughput.yaml").read_text())
    q["criteria"]["budget"] = {c: "BUDGET" for c in q["criteria"].get("concurrencies", [1])}
    q["criteria"]["formula"] = q["criteria"].get("formula") or "median_per_round_paired_loss"
    path = tmp_path / "q.yaml"
    path.write_text(yaml.safe_dump(q).replace("BUDGET", budget).replace("'" + budget + "'", budget))
    with pytest.raises(QuestionError, match="budget"):
        load_question(path)


def test_a_round_past_any_real_count_is_refused(tmp_path):
    legs = shutil.copytree(FIX / "throughput", tmp_path / "throughput")
    leg = next(p for p in legs.iterdir() if p.is_dir())
    edit_meta(leg, lambda m: m.update(round=2**70))
    with pytest.raises(ReceiptError, match="round"):
        load_leg(leg)
