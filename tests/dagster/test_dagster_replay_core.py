"""The real core through the graph, no stand-ins: the replay leg runner replays the committed
sealed receipts (tests/fixtures/receipts, an H200-shaped set), the real judges judge them under
the committed questions, the real canaries run in the blocking checks, and the report accepts."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from dagster_project import MANIFEST
from dagster_helpers import build_defs, kept_instance, materialize_track, tick

from tica.evidence import EvidenceItem
from tica.ledger import Ledger
from tica_assets.keys import evidence_key, report_key
from tica_assets.settings import PROJECT_ROOT, Settings

FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "receipts"
TRACK = "h200-replay"


def test_replayed_receipts_judged_by_the_real_core(tmp_path, monkeypatch):
    monkeypatch.setenv("TICA_CACHE_DIR", str(tmp_path / "cache"))
    candidates = tmp_path / "candidates"
    (candidates / "ckpt").mkdir(parents=True)
    (candidates / "ckpt" / "model.safetensors").write_bytes(b"h200 weights" * 16)
    manifest = copy.deepcopy(MANIFEST) | {"track": TRACK}
    manifest["hardware"] = {"accelerator": "NVIDIA H200", "count_per_node": 1}
    manifest["workload"] = {"input_len": 8192, "output_len": 1024, "concurrencies": [1, 8, 32, 64], "num_prompts": 8}
    (candidates / f"{TRACK}.yaml").write_text(yaml.safe_dump(manifest))
    settings = Settings(candidates_dir=candidates, questions_dir=FIXTURES / "questions",
                        ledger_path=tmp_path / "ledger.duckdb", data_dir=tmp_path / "data", replay={TRACK: FIXTURES})
    defs = build_defs(settings)
    instance = kept_instance(tmp_path / "dagster_home")
    tick(defs, instance)

    result = materialize_track(defs, instance, TRACK)
    assert result.success
    checks = {(e.asset_key.path[-1], e.check_name): e.passed for e in result.get_asset_check_evaluations()}
    assert checks and all(checks.values()), checks
    assert ("throughput", "workload_receipts") in checks and ("quality", "quality_sums") in checks

    verdicts = {r["item"]: r["verdict"] for r in Ledger(settings.ledger_path).rows("SELECT * FROM track_verdicts")}
    assert verdicts == {i.value: "pass" for i in EvidenceItem}
    meta = instance.get_latest_materialization_event(report_key(TRACK)).asset_materialization.metadata
    assert meta["acceptance"].value == "accepted"
    assert "median per-round paired loss" in meta["scope"].value
    throughput = instance.get_latest_materialization_event(
        evidence_key(TRACK, EvidenceItem.THROUGHPUT)).asset_materialization.metadata
    assert any(k.startswith("table: ") for k in throughput) and "plot" in throughput
    assert Path(throughput["plot_path"].value).is_file()
    assert throughput["formula"].value.startswith("median per-round paired loss")
