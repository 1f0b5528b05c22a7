"""Blocking checks stop the report: a criterion whose canary is not caught, and a receipt that
changed after it was sealed."""

from __future__ import annotations

import sys

from dagster_project import TRACK
from dagster_helpers import build_defs, kept_instance, materialize_track, tick

from tica.evidence import EvidenceItem
from tica_assets.keys import evidence_key, report_key


def run(project, tmp_path):
    defs = build_defs(project.settings)
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)
    keys = [evidence_key(TRACK, EvidenceItem.FORWARD), report_key(TRACK)]
    result = materialize_track(defs, instance, TRACK, keys=keys)
    checks = {(e.asset_key.path[-1], e.check_name): e for e in result.get_asset_check_evaluations()}
    return result, checks, instance


def test_a_canary_not_caught_blocks_the_report(project, tmp_path, monkeypatch):
    canaries = sys.modules["tica.canaries"]
    real = canaries.run_canaries

    def one_broken(questions=None, **kw):
        results = real(questions=questions, **kw)
        return [r.model_copy(update={"broken": True, "got": "pass"}) for r in results]

    monkeypatch.setattr(canaries, "run_canaries", one_broken)
    result, checks, instance = run(project, tmp_path)
    check = checks[("forward", "canaries_caught")]
    assert not check.passed and "not caught" in check.description
    assert not result.success
    assert instance.get_latest_materialization_event(report_key(TRACK)) is None


def test_a_receipt_changed_after_sealing_blocks_the_report(project, tmp_path):
    leg = project.root / "receipts" / "forward" / "bi1"
    (leg / "metrics.jsonl").write_text((leg / "metrics.jsonl").read_text().replace('"step": 3', '"step": 4'))
    result, checks, instance = run(project, tmp_path)
    check = checks[("forward", "receipts_sealed")]
    assert not check.passed and "changed after sealing" in check.description
    assert instance.get_latest_materialization_event(report_key(TRACK)) is None
