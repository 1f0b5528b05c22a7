"""The matrix producer's plumbing on the CPU (`producers matrix --dry-run`): the orchestrator runs
each (candidate, shape) in its own process, every leg it wrote is sealed with that process's exit,
and the matrix judge reads them. A dry run scores the reference model against itself with
VLLM_BATCH_INVARIANT=0 in its environment, so its legs record the arm they ran (bi0: leg.json's one
writer refuses a bi1 leg whose environment says otherwise) and its cells must not pass as BI=1
evidence: the judge says no BI=1 leg ran (tests/test_h200_matrix.py judges the H200's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tica.judges.matrix import matrix_cells
from tica.question import load_question
from tica.seal import check_seal
from tica.verdict import Verdict

ROOT = Path(__file__).resolve().parents[2]
QUESTION = load_question(ROOT / "demo" / "questions" / "h200-matrix" / "forward.yaml")


def dry_run(tmp_path: Path, shape: str, loads: str) -> tuple[Path, Path]:
    """`producers matrix --dry-run` of one stock cell; (out, work)."""
    out, work = tmp_path / "out", tmp_path / "work"
    r = subprocess.run([sys.executable, "-m", "tica.legs.vllm_kernels.producers", "matrix", "--dry-run",
                        "--shapes", shape, "--candidates", "stock", "--loads", loads, "--out", str(out),
                        "--work", str(work), "--budget", "600", "--min-cell-s", "1"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return out, work


def test_a_dry_run_writes_sealed_cells_the_judge_reads(tmp_path):
    out, work = dry_run(tmp_path, "tiny_qwen", "c1")
    status = json.loads((out / "status.json").read_text())
    assert status["cells"]["stock-tiny_qwen"]["rc"] == 0 and status["not_started"] == []
    legs = sorted((work / "legs").iterdir())
    assert [p.name for p in legs] == ["mx-stock-tiny_qwen-c1-decode", "mx-stock-tiny_qwen-c1-prefill"]
    assert all(check_seal(p) == [] for p in legs)
    assert all(json.loads((p / "leg.json").read_text())["processes"][0]["exit_code"] == 0 for p in legs)
    cells = matrix_cells(QUESTION, work)
    assert [(c.scored, c.verdict) for c in cells] == [("decode", Verdict.INCONCLUSIVE), ("prefill", Verdict.INCONCLUSIVE)]
    assert all(json.loads((p / "leg.json").read_text())["arm"] == "bi0" for p in legs)
    assert all(any("no BI=1 forward leg" in r for r in c.reasons) and c.cause.startswith("not judged") for c in cells)
    row = json.loads((legs[0] / "metrics.jsonl").read_text())
    assert set(row["tica/variants"]) >= {"product", "unpadded_lm_head", "decode_rows_255"}
    summary = json.loads((work / "logs" / "stock-tiny_qwen.summary.json").read_text())
    assert summary["update"].startswith("not run")


def test_a_moe_dry_run_writes_both_sides_routes_and_the_moe_update(tmp_path):
    """A MoE shape: every cell's arrays hold both sides' routes per scored token (here the reference
    model's own, so equal), the router fault gets its leg, the update runs the MoE backward with its
    check and control; still bi0 legs, so nothing passes."""
    import numpy as np

    _, work = dry_run(tmp_path, "tiny_moe", "c1,c16")
    names = {p.name for p in (work / "legs").iterdir()}
    assert {"mx-stock-tiny_moe-c16-fault_torch_router", "mx-stock-tiny_moe-c16-prefill_post_update"} <= names
    for name in names:
        z = np.load(work / "legs" / name / "arrays" / "step_0001.npz")
        assert z["rollout_experts"].shape == z["trainer_experts"].shape == (z["token_ids"].size, 2, 2)
        assert (z["rollout_experts"] == z["trainer_experts"]).all()
    row = json.loads((work / "legs" / "mx-stock-tiny_moe-c1-prefill" / "metrics.jsonl").read_text())
    assert row["tica/routes"]["prefill"].startswith("the reference model's own routes")
    update = json.loads((work / "logs" / "stock-tiny_moe.summary.json").read_text())["update"]
    assert update["moe_backward_check"]["pass"] and update["moe_backward_check"]["control_caught"]
    assert "moe" in update["backward_impls"] and update["grad_finite"]
    cells = matrix_cells(QUESTION, work)
    assert cells and all(c.verdict == Verdict.INCONCLUSIVE for c in cells)
