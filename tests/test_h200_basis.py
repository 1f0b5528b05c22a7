"""The issue-12 H200 runs (tests/fixtures/h200/basis.tar.xz) judged under the questions whose
statistical basis `tica plan` drafted from the earlier pilots and that were frozen before these
runs. Nothing here touches a GPU: the sealed receipts came back from the lent H200.

- h200-smollm2: quality, SmolLM2-135M-Instruct on arith1000 (run7, then run9).
- h200-tput: throughput at c=1 and 64, 8192 in / 1024 out (run7: 3 rounds, run8: 6 rounds).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tica.judges import judge, judge_criteria, load_candidate
from tica.question import load_question
from tica.receipt_archive import unpacked
from tica.seal import check_seal
from tica.verdict import Verdict

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT / "tests" / "fixtures" / "h200" / "basis.tar.xz"
QUESTIONS = ROOT / "demo" / "questions"
CANDIDATES = ROOT / "demo" / "candidates"


@pytest.fixture(scope="module")
def basis(tmp_path_factory) -> Path:
    return unpacked(ARCHIVE, tmp_path_factory.mktemp("receipts"))


def run(basis: Path, track: str, item: str, name: str) -> list[Path]:
    entry = next(r for r in yaml.safe_load((basis / track / "replay.yaml").read_text())[item] if r["run"] == name)
    return [p for pattern in entry["legs"] for p in sorted((basis / track).glob(pattern))]


def q(track: str, item: str):
    return load_question(QUESTIONS / track / f"{item}.yaml")


def test_every_leg_in_the_archive_is_sealed_and_verifies(basis):
    legs = sorted(p.parent for p in basis.rglob("seal.json"))
    assert len(legs) == 24 + 24 + 2 + 2  # run7 throughput: rounds 4-6 sealed as not run (the deadline)
    assert all(check_seal(leg) == [] for leg in legs)


# ---------------------------------------------------------------- quality (h200-smollm2)

def test_quality_on_1000_problems_is_decided_and_passes_for_its_candidate(basis):
    cell = judge("quality", q("h200-smollm2", "quality"), run(basis, "h200-smollm2", "quality", "run9"),
                 load_candidate(CANDIDATES / "h200-smollm2.yaml"))
    assert cell.verdict is Verdict.PASS, cell.reasons
    decision = cell.numbers["decision"]
    assert (decision["decision"], decision["problems"], decision["diff_points"]) == ("pass", 1000, 0.7)
    assert -5 < decision["lower_bound_points"] < decision["upper_bound_points"] < 5  # [-0.87, 2.62] points


def test_the_same_legs_under_a_threshold_they_cannot_decide_are_not_a_pass(basis):
    """Negative control: the frozen basis, with the threshold at 1 point, cannot be met by bounds
    2.6 points wide: the same receipts are inconclusive, never passed."""
    question = q("h200-smollm2", "quality")
    tight = question.model_copy(update={"criteria": question.criteria.model_copy(update={"threshold_points": 1.0})})
    cell = judge_criteria("quality", tight, run(basis, "h200-smollm2", "quality", "run9"))
    assert cell.verdict is not Verdict.PASS


def test_run7_quality_recorded_its_scores_as_arm_config_and_is_not_a_pass(basis):
    cell = judge("quality", q("h200-smollm2", "quality"), run(basis, "h200-smollm2", "quality", "run7"),
                 load_candidate(CANDIDATES / "h200-smollm2.yaml"))
    assert cell.verdict is Verdict.INCONCLUSIVE
    text = " ".join(cell.reasons)
    assert "resolved_config.passes.greedy.score" in text  # the outcome recorded where config belongs
    assert "source" in text  # and it ran from another tree than the candidate pins


def test_the_quality_engines_ended_cleanly_but_no_api_server_ran(basis):
    cell = judge_criteria("clean_exit", q("h200-smollm2", "clean_exit"), run(basis, "h200-smollm2", "quality", "run9"))
    assert cell.verdict is Verdict.INCONCLUSIVE  # the question requires client and API server receipts
    assert any("client" in r and "api_server" in r for r in cell.reasons)
    assert all(p["status"] == "clean" for p in cell.numbers["processes"]), cell.numbers["processes"]


# ---------------------------------------------------------------- throughput (h200-tput)

def test_throughput_c1_is_under_budget_by_the_frozen_test_but_its_tiers_keep_it_undecided(basis):
    cell = judge_criteria("throughput", q("h200-tput", "throughput"), run(basis, "h200-tput", "throughput", "run8"))
    assert cell.verdict is Verdict.INCONCLUSIVE
    c1 = cell.numbers["per_concurrency"]["1"]
    assert c1["valid_rounds"] == [1, 2, 3, 4, 5] and c1["decision"]["decision"] == "pass"
    assert c1["decision"]["upper_bound"] < 0.30
    assert any("c=1: bi0 throughput shows fast/slow tiers" in r for r in cell.reasons)


def test_throughput_c64_names_the_rounds_that_would_decide_it(basis):
    cell = judge_criteria("throughput", q("h200-tput", "throughput"), run(basis, "h200-tput", "throughput", "run8"))
    c64 = cell.numbers["per_concurrency"]["64"]
    assert c64["decision"]["decision"] == "inconclusive" and c64["decision"]["upper_bound"] > 0.30
    assert c64["decision"]["more_rounds"] and c64["decision"]["more_rounds"] > 0
    assert any("c=64: inside the noise" in r and "more crossed round" in r for r in cell.reasons)


def test_run7_held_three_of_the_five_frozen_rounds(basis):
    cell = judge_criteria("throughput", q("h200-tput", "throughput"), run(basis, "h200-tput", "throughput", "run7"))
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any("3 valid round(s) of the 5 frozen" in r for r in cell.reasons)


def test_every_server_client_and_engine_core_exited_zero_but_no_exit_names_its_process(basis):
    """The clean exit issue 12 asked for, on vLLM 0.26 on the H200: --shutdown-timeout 30, every
    API server and EngineCore exit code 0 (run6, without it, had every EngineCore force-killed).
    Run8's producer predates process identities (create time, name, command line read from the
    process): its exits cannot show that each role ran as its own process, so the cell is
    inconclusive, never pass (issue 27)."""
    legs = run(basis, "h200-tput", "throughput", "run8")
    cell = judge_criteria("clean_exit", q("h200-tput", "clean_exit"), legs)
    roles = {(p["role"], p["status"]) for p in cell.numbers["processes"]}
    assert roles == {("client", "clean"), ("api_server", "clean"), ("engine_core", "clean")}
    assert cell.verdict is Verdict.INCONCLUSIVE, cell.reasons
    assert any("record no process identity" in r for r in cell.reasons), cell.reasons


def test_run8_throughput_is_not_evidence_for_the_candidate_where_its_legs_record_nothing(basis):
    """The producer of these legs did not record tp/pp/dp/ep (and the arms' ports and kernel
    labels differed in what it wrote): bound to the manifest, the cell says so and cannot pass."""
    cell = judge("throughput", q("h200-tput", "throughput"), run(basis, "h200-tput", "throughput", "run8"),
                 load_candidate(CANDIDATES / "h200-tput.yaml"))
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any("runner.parallelism.tp" in r and "records nothing" in r for r in cell.reasons)
    assert any("unquantified confounders" in r and "resolved_config.server_cmd" in r for r in cell.reasons)
