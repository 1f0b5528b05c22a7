"""The CPU leg runner launches each leg's producer as its own process through Dagster Pipes,
with the arm's switch in the child's environment, and judges what the child sealed."""

from __future__ import annotations

import json
import os
from pathlib import Path

from dagster_project import TRACK
from dagster_helpers import build_defs, kept_instance, tick

from resources import CpuLegRunner, plan_legs
from resources.legs import progress_line
from tica.evidence import EvidenceItem
from tica.question import load_question
from tica_assets.keys import evidence_key

HERE = Path(__file__).resolve().parent


def test_cpu_runner_runs_each_leg_through_pipes_with_its_arm_switch(project, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    settings = type(project.settings)(**{**project.settings.__dict__, "replay": {}})
    defs = build_defs(settings, resources={"leg_runner": CpuLegRunner(producer_module="dagster_fake_producer")})
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)
    result = defs.resolve_job_def(f"{TRACK}_evidence").execute_in_process(
        instance=instance, asset_selection=[evidence_key(TRACK, EvidenceItem.FORWARD)]
    )
    assert result.success
    meta = instance.get_latest_materialization_event(evidence_key(TRACK, EvidenceItem.FORWARD)).asset_materialization.metadata
    legs = [Path(p) for p in meta["leg_dirs"].value]
    assert [p.name for p in legs] == ["bi1-s1", "bi0-s2"]
    for leg in legs:
        leg_json = json.loads((leg / "leg.json").read_text())
        assert leg_json["env"]["VLLM_BATCH_INVARIANT"] == ("1" if leg_json["arm"] == "bi1" else "0")
        assert leg_json["flags"] == {"--model": str(project.checkpoint.resolve()), "--trainer": "vllm_kernels", "--steps": "5"}
        assert leg.is_relative_to(settings.legs_dir / TRACK)
    assert meta["leg_runner"].value == "CpuLegRunner"
    said = [e.user_message for e in instance.all_logs(result.run_id)]
    progress = [m for m in said if m.startswith("forward leg ")]
    assert [m.split(", ")[0] for m in progress] == ["forward leg 1 of 2: bi1", "forward leg 2 of 2: bi0"], said
    assert all(m.endswith(" elapsed") for m in progress) and any(m.startswith("forward: 2 leg(s) sealed in ") for m in said)


def test_progress_names_the_leg_its_arm_concurrencies_round_and_elapsed_time(project):
    question = load_question(project.settings.questions_dir / "throughput.yaml")
    plan = plan_legs(EvidenceItem.THROUGHPUT, question)
    cs = ",".join(str(c) for c in question.criteria.concurrencies)
    assert progress_line(3, len(plan), plan[2], question, 65.4) == (
        f"throughput leg 3 of {len(plan)}: bi0, c={cs}, round 2, 1 min 05 s elapsed")
    forward = load_question(project.settings.questions_dir / "forward.yaml")
    (first, *_) = plan_legs(EvidenceItem.FORWARD, forward)
    assert progress_line(1, 2, first, forward, 0.2) == "forward leg 1 of 2: bi1, 0 s elapsed"


def test_throughput_legs_follow_the_frozen_crossed_order(project):
    question = load_question(project.settings.questions_dir / "throughput.yaml")
    plan = [(s.round, s.slot, s.arm) for s in plan_legs(EvidenceItem.THROUGHPUT, question)]
    assert plan == [(r, s, arm) for r in range(1, 6)
                    for s, arm in enumerate(("bi1", "bi0") if r % 2 else ("bi0", "bi1"), 1)]  # AB/BA/AB/BA/AB
    assert plan[:4] == [(1, 1, "bi1"), (1, 2, "bi0"), (2, 1, "bi0"), (2, 2, "bi1")]
    assert plan_legs(EvidenceItem.ARTIFACTS, question) == []


def test_replay_finds_each_items_sealed_legs_in_any_layout(tmp_path):
    import shutil
    from types import SimpleNamespace

    from dagster import build_asset_context

    from resources import ReplayLegRunner

    fixtures = Path(__file__).resolve().parents[1] / "fixtures" / "receipts"
    flat = tmp_path / "run1"
    shutil.copytree(fixtures / "forward" / "forward_bi1", flat / "forward_bi1_r1")
    shutil.copytree(fixtures / "throughput" / "tput_c001_r1_s1_bi1", flat / "throughput_bi1_r1_c1")
    runner = ReplayLegRunner(receipts_dir=str(flat))
    context = build_asset_context()
    legs = runner.run_legs(context, SimpleNamespace(track="h200", item=EvidenceItem.FORWARD))
    assert [p.name for p in legs] == ["forward_bi1_r1"]
    nested = ReplayLegRunner(receipts_dir=str(fixtures))
    legs = nested.run_legs(context, SimpleNamespace(track="h200", item=EvidenceItem.QUALITY))
    assert sorted(p.name for p in legs) == ["quality_bi0", "quality_bi1"]
