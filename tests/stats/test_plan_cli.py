"""`tica plan`: a pilot's legs in, a plan and a question draft with a statistical basis out."""

from __future__ import annotations

import io
import json
import statistics
from pathlib import Path

import pytest
import yaml

from tests.stats.pilots import throughput_question, write_pilot
from tica.cli.plan import build_parser, run
from tica.judges import judge_criteria
from tica.question import load_question
from tica.receipts import load_bench_leg
from tica.stats import throughput as tstats
from tica.verdict import Verdict

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "tests" / "fixtures" / "h200"
H200_QUESTIONS = ROOT / "demo" / "questions" / "h200-mid4"
RECEIPTS = ROOT / "tests" / "fixtures" / "receipts"

# Pilot losses per concurrency over 4 crossed rounds: each c its own median and spread.
PILOT = {1: [0.02, 0.03, 0.025, 0.035], 8: [0.04, 0.07, 0.05, 0.06], 32: [0.05, 0.11, 0.02, 0.08],
         64: [0.06, 0.065, 0.07, 0.062]}


def plan(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    rc = run(build_parser().parse_args(["plan", *argv]), out=out)
    return rc, out.getvalue()


@pytest.fixture
def pilot(tmp_path):
    q = throughput_question(4)
    qpath = tmp_path / "q.yaml"
    qpath.write_text(yaml.safe_dump(q.model_dump(mode="json")))
    legs = write_pilot(q, tmp_path / "pilot", PILOT)
    return qpath, legs


def test_a_pilot_names_the_rounds_each_concurrency_needs_and_drafts_a_basis(pilot, tmp_path):
    qpath, legs = pilot
    out = tmp_path / "draft.yaml"
    rc, text = plan("throughput", str(legs[0].parent), "-q", str(qpath), "--budget", "0.10", "--out", str(out))
    assert rc == 0, text
    draft = load_question(out)
    basis = draft.criteria.statistical_basis
    for c, losses in PILOT.items():
        assert basis.min_detectable_difference[c] == pytest.approx(0.10 - statistics.median(losses))
        assert f"| {c} | 4 |" in text
    needed = {c: tstats.rounds_needed(0.10 - statistics.median(v), statistics.stdev(v), 0.05, 0.8)
              for c, v in PILOT.items()}
    assert basis.rounds == draft.repeats == max(needed.values())
    assert list(draft.pairing_order[:3]) == ["AB", "BA", "AB"] and len(draft.pairing_order) == basis.rounds
    assert set(basis.pilot_digests) == {load_bench_leg(p).digest for p in legs}
    assert draft.name.endswith("-planned") and draft.hash != load_question(qpath).hash
    assert out.read_text().startswith("# DRAFT written by `tica plan throughput`: NOT FROZEN")


def test_the_pilot_itself_never_passes_the_drafted_question(pilot, tmp_path):
    """Negative control: the draft asks for more rounds than the pilot has: its own legs are no pass."""
    qpath, legs = pilot
    out = tmp_path / "draft.yaml"
    assert plan("throughput", *map(str, legs), "-q", str(qpath), "--budget", "0.10", "--out", str(out))[0] == 0
    cell = judge_criteria("throughput", load_question(out), legs)
    assert cell.verdict is Verdict.INCONCLUSIVE
    assert any("the statistical basis needs" in r for r in cell.reasons)


def test_json_output_carries_the_plan_and_the_drafts_hash(pilot, tmp_path):
    qpath, legs = pilot
    out = tmp_path / "draft.yaml"
    rc, text = plan("throughput", *map(str, legs), "-q", str(qpath), "--budget", "32=0.15", "--budget", "0.10",
                    "--mdd", "8=0.02", "--out", str(out), "--json")
    data = json.loads(text)
    rows = {r["c"]: r for r in data["plan"]["per_concurrency"]}
    assert rc == 0 and rows[32]["budget"] == 0.15 and rows[1]["budget"] == 0.10 and rows[8]["margin"] == 0.02
    assert data["question_hash"] == load_question(out).hash


def test_a_pilot_of_one_round_per_concurrency_plans_nothing(tmp_path):
    q = throughput_question(1, concurrencies=[8], num_prompts={8: 32}, budget={8: 0.1})
    qpath = tmp_path / "q.yaml"
    qpath.write_text(yaml.safe_dump(q.model_dump(mode="json")))
    legs = write_pilot(q, tmp_path / "pilot", {8: [0.05]})
    out = tmp_path / "draft.yaml"
    rc, text = plan("throughput", *map(str, legs), "-q", str(qpath), "--out", str(out))
    assert rc == 1 and "at least 2 crossed rounds are needed" in text and not out.exists()


@pytest.mark.parametrize("argv,field", [
    (["--budget", "2=0.1"], "--budget"),
    (["--budget", "x"], "--budget"),
    (["--budget", "0.1", "--alpha", "0.6"], "--alpha"),
    (["--budget", "0.1", "--power", "1"], "--power"),
    (["--budget", "1.5"], "--budget"),
    (["--budget", "0.1", "--mdd", "8=-0.01"], "--mdd"),
])
def test_bad_input_exits_4_naming_the_field(pilot, tmp_path, argv, field):
    qpath, legs = pilot
    rc, text = plan("throughput", *map(str, legs), "-q", str(qpath), *argv, "--out", str(tmp_path / "d.yaml"), "--json")
    assert rc == 4 and json.loads(text)["error"]["field"] == field


def test_a_ratio_of_medians_question_cannot_be_planned(tmp_path, pilot):
    _, legs = pilot
    q = throughput_question(4, formula="ratio_of_median_throughputs")
    qpath = tmp_path / "ratio.yaml"
    qpath.write_text(yaml.safe_dump(q.model_dump(mode="json")))
    rc, text = plan("throughput", *map(str, legs), "-q", str(qpath), "--out", str(tmp_path / "d.yaml"), "--json")
    err = json.loads(text)["error"]
    assert rc == 4 and err["field"] == "criteria.formula" and err["file"] == str(qpath)


def test_a_quality_question_is_not_a_throughput_plan(pilot, tmp_path):
    _, legs = pilot
    rc, text = plan("throughput", *map(str, legs), "-q", str(RECEIPTS / "questions" / "quality.yaml"),
                    "--out", str(tmp_path / "d.yaml"), "--json")
    assert rc == 4 and json.loads(text)["error"]["field"] == "item"


# ---------------------------------------------------------------- the committed H200 legs as a pilot


def h200(*extra: str, out: Path) -> tuple[int, str]:
    return plan("throughput", *sorted(map(str, (H200 / "run6").glob("throughput_*"))),
                "-q", str(H200_QUESTIONS / "throughput.yaml"), "--budget", "0.30", "--out", str(out), *extra)


def test_the_h200_pilot_counts_no_round_whose_server_was_force_killed(tmp_path):
    rc, text = h200(out=tmp_path / "d.yaml")
    assert rc == 1 and not (tmp_path / "d.yaml").exists()
    assert text.count("0 valid pilot round(s)") == 4


def test_the_h200_pilot_names_the_rounds_each_concurrency_needs_for_a_030_budget(tmp_path):
    """run6 taken as a pilot (its rounds' only defects are the servers' force-killed children at
    shutdown, counted for the noise by choice and named): at a 0.30 budget, alpha 0.05, power 0.8,
    c=1 needs 5 crossed rounds, c=8 23, c=64 30; c=32 (median 0.287, SD 0.116) would need 833 and
    is left unplanned. The draft freezes 30 rounds."""
    out = tmp_path / "d.yaml"
    rc, text = h200("--allow-unclean-exits", "--json", out=out)
    data = json.loads(text)
    rows = {r["c"]: r for r in data["plan"]["per_concurrency"]}
    assert rc == 0
    assert {c: r["rounds_needed"] for c, r in rows.items()} == {1: 5, 8: 23, 32: 833, 64: 30}
    assert {c for c, r in rows.items() if r["planned"]} == {1, 8, 64}
    assert rows[32]["median"] == pytest.approx(0.2874, abs=1e-4)
    draft = load_question(out)
    assert draft.repeats == draft.criteria.statistical_basis.rounds == 30
    assert any("despite unclean exit receipts" in n for n in draft.criteria.statistical_basis.notes)
    assert len(draft.criteria.statistical_basis.pilot_digests) == 24


# ---------------------------------------------------------------- quality


def test_a_quality_pilot_names_the_problems_a_one_problem_threshold_needs(tmp_path):
    out = tmp_path / "q.yaml"
    rc, text = plan("quality", str(RECEIPTS / "quality"), "-q", str(RECEIPTS / "questions" / "quality.yaml"),
                    "--out", str(out), "--json")
    data = json.loads(text)["plan"]
    assert rc == 0 and data["n"] == 30 and data["only_bi1"] == data["only_bi0"] == 1
    draft = load_question(out)
    basis = draft.criteria.statistical_basis
    assert basis.problems == draft.criteria.expected_problems == data["problems"] > 500
    assert basis.repeats == 1 and len(basis.pilot_digests) == 2


def test_sampled_decoding_spreads_the_problems_over_repeats(tmp_path):
    qdata = load_question(RECEIPTS / "questions" / "quality.yaml").model_dump(mode="json")
    qdata["criteria"]["greedy"] = False
    qpath = tmp_path / "sampled.yaml"
    qpath.write_text(yaml.safe_dump(qdata))
    rc, text = plan("quality", str(RECEIPTS / "quality"), "-q", str(qpath), "--problems-available", "100",
                    "--out", str(tmp_path / "d.yaml"), "--json")
    data = json.loads(text)["plan"]
    assert rc == 0 and data["repeats"] == -(-data["problems"] // 100)
    assert any("independent pairs" in n for n in data["notes"])


def test_the_h200_quality_pilot_over_its_threshold_plans_nothing(tmp_path):
    rc, text = plan("quality", str(H200 / "run4" / "quality_bi1"), str(H200 / "run4" / "quality_bi0"),
                    "-q", str(H200_QUESTIONS / "quality.yaml"), "--out", str(tmp_path / "d.yaml"))
    assert rc == 1 and "at or over the threshold" in text


def test_add_parser_wires_plan_into_a_tica_parser_and_usage_errors_exit_4():
    from tica.errors import UsageParser
    from tica.cli.plan import add_parser

    parser = UsageParser(prog="tica")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", "quality", "legdir", "-q", "q.yaml", "--out", "d.yaml"])
    assert args.func is run and args.sub == "quality"
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["plan", "throughput", "legdir", "-q", "q.yaml"])  # no --out
    assert exit_.value.code == 4
