"""A whole TICA project in a temporary folder: a candidate manifest (one track), its small
checkpoint, one frozen question per evidence item, small sealed receipts for the replay leg
runner (recorded before any question was frozen: judged after the fact, never accepted), and a
leg runner whose receipts are written when a materialization asks (`fresh_defs`). No stand-ins:
the real judges, binding, canaries and checks judge them."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.manifests import BASE_MANIFEST
from tica.evidence import EvidenceItem
from resources.legs import LegRunner
from tica.seal import seal_leg
from tica_assets.settings import Settings

TRACK = "demo"
MANIFEST: dict[str, Any] = copy.deepcopy(BASE_MANIFEST) | {"track": TRACK, "description": "dagster test candidate"}
MANIFEST["runner"]["trainer"] = "vllm_kernels"
MANIFEST["workload"]["num_prompts"] = 4

_Q = {
    "compared": "the evidence item's quantity",
    "computation": "as docs/receipts.md says",
    "pass_line": "see criteria",
    "noise_floor": 0.0,
    "invalid_leg_rule": "a leg without a seal or with a failed exit is invalid and rerun",
}
ROUNDS = 5  # the throughput question's crossed rounds (= its statistical basis's rounds)
ORDER = ["AB" if r % 2 == 0 else "BA" for r in range(ROUNDS)]
CRITERIA: dict[EvidenceItem, dict] = {
    EvidenceItem.FORWARD: {"item": "forward", "min_steps": 5, "bi0_reference_mean": 0.01},
    EvidenceItem.BACKWARD: {"item": "backward"},
    EvidenceItem.UPDATE: {"item": "update"},
    EvidenceItem.QUALITY: {"item": "quality", "threshold_points": 10.0, "expected_problems": 10},
    EvidenceItem.THROUGHPUT: {
        "item": "throughput", "input_len": 64, "output_len": 16, "concurrencies": [1, 2],
        "formula": "median_per_round_paired_loss", "budget": {1: 0.5, 2: 0.5},
        # Without a reviewed basis a budget is reported, never passed: the sign test over 5 crossed
        # rounds (the fewest that can pass at alpha 0.05: 0.5^5 = 0.031), every round under budget.
        "statistical_basis": {"test": "sign_test_median", "alpha": 0.05, "rounds": 5,
                              "pilot_digests": ["sha256:" + "5d" * 32],
                              "notes": ["tests: synthetic rounds (tica.canaries' builder), not planned from a pilot"]},
    },
    EvidenceItem.CLEAN_EXIT: {"item": "clean_exit"},
    EvidenceItem.ARTIFACTS: {"item": "artifacts"},
}


@dataclass
class Project:
    root: Path
    settings: Settings

    @property
    def manifest_path(self) -> Path:
        return self.settings.candidates_dir / f"{TRACK}.yaml"

    @property
    def checkpoint(self) -> Path:
        return self.settings.candidates_dir / "ckpt"

    def manifest(self) -> dict:
        return yaml.safe_load(self.manifest_path.read_text())

    def write_manifest(self, data: dict) -> None:
        self.manifest_path.write_text(yaml.safe_dump(data, sort_keys=False))

    def edit(self, section: str, **changes) -> None:
        data = self.manifest()
        data[section] = {**data[section], **changes}
        self.write_manifest(data)

    def new_weights(self, tag: str) -> None:
        (self.checkpoint / "model.safetensors").write_bytes(b"weights " + tag.encode() * 64)

    def env(self) -> dict[str, str]:
        s = self.settings
        return {
            "TICA_CANDIDATES_DIR": str(s.candidates_dir),
            "TICA_QUESTIONS_DIR": str(s.questions_dir),
            "TICA_LEDGER": str(s.ledger_path),
            "TICA_DATA_DIR": str(s.data_dir),
            "TICA_REPLAY": f"*={self.root / 'receipts'}",
            "TICA_SENSOR_INTERVAL_S": "5",
        }


def build_project(root: Path) -> Project:
    settings = Settings(
        candidates_dir=root / "candidates",
        questions_dir=root / "questions",
        ledger_path=root / "data" / "ledger.duckdb",
        data_dir=root / "data",
        replay={"*": root / "receipts"},
        sensor_interval_s=5,
    )
    project = Project(root=root, settings=settings)
    settings.candidates_dir.mkdir(parents=True)
    project.checkpoint.mkdir()
    (project.checkpoint / "config.json").write_text('{"hidden_size": 256}')
    project.new_weights("v1")
    project.write_manifest(copy.deepcopy(MANIFEST))
    settings.questions_dir.mkdir(parents=True)
    for item, criteria in CRITERIA.items():
        q = {"name": f"test-{item.value}/1", "item": item.value, **_Q, "criteria": criteria}
        if item is EvidenceItem.THROUGHPUT:
            q.update(repeats=ROUNDS, pairing_order=ORDER)
        (settings.questions_dir / f"{item.value}.yaml").write_text(yaml.safe_dump(q, sort_keys=False))
    write_receipts(root / "receipts")
    return project


# ---------------------------------------------------------------------------- receipts


def _leg(folder: Path, item: str, arm: str, files: dict[str, Any], *, round=None, slot=None, concurrency=None,
         resolved_config=None) -> Path:
    folder.mkdir(parents=True)
    for rel, content in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, list):
            path.write_text("".join(json.dumps(r) + "\n" for r in content))
        else:
            path.write_text(json.dumps(content))
    meta = {
        "schema": "tica.leg/1", "item": item, "arm": arm, "round": round, "slot": slot,
        "concurrency": concurrency, "producer": f"tests.{item}", "producer_version": "1",
        "trainer": "vllm_kernels", "env": {"VLLM_BATCH_INVARIANT": "1" if arm == "bi1" else "0"},
        "versions": {"python": "3.11"}, "device": {"kind": "cpu"}, "kernels": {},
        "resolved_config": resolved_config or {"weights_hash": "blake3:" + "0" * 64}, "profiled": False,
        "started_at": "2026-11-29T00:00:00+00:00", "ended_at": "2026-11-29T00:01:00+00:00",
        "processes": [
            {"role": "client", "pid": 1, "exit_code": 0, "end_state": "exited", "signal": None, "evidence": "returned"},
            {"role": "engine_core", "pid": 2, "exit_code": 0, "end_state": "exited", "signal": None, "evidence": "joined"},
        ],
        "not_run_reason": None,
    }
    (folder / "leg.json").write_text(json.dumps(meta, indent=1))
    seal_leg(folder)
    return folder


def _forward_steps(arm: str) -> list[dict]:
    diff = 0.0 if arm == "bi1" else 0.012
    return [
        {"step": s, "step_basis": "rollout", "checkpoint_version": "blake3:" + "0" * 64,
         "training/rollout_probs_diff_max": diff * 20, "training/rollout_probs_diff_mean": diff,
         "training/rollout_probs_diff_std": diff / 2, "training/rollout_actor_probs_pearson_corr": 1.0 - diff,
         "rollout_corr/k3_kl": diff / 100, "tica/n_tokens": 256,
         "tica/n_bitwise_diff": 0 if arm == "bi1" else 200, "tica/logprob_abs_diff_max": diff * 3}
        for s in range(1, 6)
    ]


def write_receipts(root: Path) -> None:
    for arm in ("bi1", "bi0"):
        _leg(root / "forward" / arm, "forward", arm, {"metrics.jsonl": _forward_steps(arm)})
        grads = [{"step": 1, "actor/grad_norm": 1.5, "grad_finite": True, "params_total": 24,
                  "params_with_grad": 24, "params_nonzero_grad": 24, "deployed_bytes_equal": True}]
        _leg(root / "backward" / arm, "backward", arm, {"metrics.jsonl": grads})
        update = [{**grads[0], "optimizer": "adamw", "weights_changed_tensors": 24, "weights_total_tensors": 24,
                   "updated_weights_hash": "blake3:" + "1" * 64, "reloaded_by_rollout": True}]
        _leg(root / "update" / arm, "update", arm,
             {"metrics.jsonl": update, "post_forward/metrics.jsonl": _forward_steps(arm)})
        results = [{"problem_id": f"p{i:03d}", "correct": (i % 3 != 0) if arm == "bi1" else (i % 4 != 0),
                    "prompt_hash": f"sha256:{i:064d}", "response": "\\boxed{4}", "extracted": "4", "truncated": False}
                   for i in range(10)]
        contract = {**MANIFEST["eval_contract"], "sampling": {"temperature": 0, "top_p": 1, "top_k": -1, "seed": 0,
                                                             "n": 1, "stop": []}}
        _leg(root / "quality" / arm, "quality", arm, {"results.jsonl": results, "contract.json": contract})
        _leg(root / "clean_exit" / arm, "clean_exit", arm, {})
    for c in (1, 2):
        for r, order in ((r, ("bi1", "bi0") if o == "AB" else ("bi0", "bi1")) for r, o in enumerate(ORDER, 1)):
            for slot, arm in enumerate(order, start=1):
                n = 4
                tput = (100.0 if arm == "bi0" else 92.0) * c + r
                bench = {"completed": n, "failed": 0, "duration": 10.0, "total_input_tokens": 64 * n,
                         "total_output_tokens": 16 * n, "request_throughput": n / 10, "output_throughput": tput,
                         "total_token_throughput": tput * 5, "mean_ttft_ms": 20.0, "mean_tpot_ms": 5.0,
                         "max_concurrency": c, "arm": arm, "round": str(r), "slot": str(slot)}
                cfg = {"num_prompts": n, "num_warmups": 1, "input_len": 64, "output_len": 16, "ignore_eos": True}
                _leg(root / "throughput" / f"{arm}-c{c}-r{r}", "throughput", arm, {"bench.json": bench},
                     round=r, slot=slot, concurrency=c, resolved_config=cfg)


# ---------------------------------------------------------------------------- a producer


class FreshReceiptsRunner(LegRunner):
    """Stands in for the producers of a candidate whose legs run when asked (after the question
    is frozen): each call writes the item's passing receipt set for the frozen question
    (tica.canaries' builders), recording the candidate the manifest names now and the time it
    ran, and seals it. The real judges, binding, canaries and checks then judge it."""

    def run_legs(self, context, request) -> list[Path]:
        if request.item is EvidenceItem.ARTIFACTS:
            return []
        from tests.bound_receipts import build_bound
        from tica.binding import Candidate
        from tica.candidate import identify

        candidate = Candidate.of(request.manifest, identify(request.manifest))
        return build_bound(request.item, request.question, candidate, request.out_dir)


def fresh_defs(project: "Project", settings: Settings | None = None):
    """The code location with the track's legs run by FreshReceiptsRunner."""
    from tica_assets.definitions import build_defs
    from tica_assets.keys import leg_runner_key

    return build_defs(settings or project.settings, resources={leg_runner_key(TRACK, True): FreshReceiptsRunner()})
