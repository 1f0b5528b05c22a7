"""The demo's CPU track decides what a CPU can. Its producers, run as the demo runs them (the legs
`plan_legs` / `leg_params` plan from demo/questions/*.yaml and demo/candidates/cpu-tiny.yaml),
record every value the manifest pins, read from vLLM's resolved config and from the trainer that
ran: the clean-exit and artifacts cells pass bound to the demo candidate, a leg whose EngineCore was
force-killed never passes, and BI=1 is `not run` because it needs a GPU.

The default (short slice): the clean-exit legs and one planted force-kill, judged with the
binding. `TICA_TESTS=full` (tests/long.py) also runs every other producer of the demo (about ten
minutes on two cores) and judges clean exit over every leg it covers and artifacts over all."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.legs.conftest import leg_json
from tica.evidence import COVERS, EvidenceItem
from tica.verdict import Verdict

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "demo" / "candidates" / "cpu-tiny.yaml"
QUESTIONS = REPO / "demo" / "questions"
GPU_REASON = "BI=1 needs a GPU because vLLM's batch-invariant mode"


@pytest.fixture(scope="module")
def track(tmp_path_factory):
    """The demo candidate: its manifest, unchanged, beside the tiny model at the path it names, its
    `source.commit: working-tree` resolved to this checkout (what load_manifest does for the
    manifest where it lies; the copy lies outside the checkout)."""
    from tica.binding import Candidate
    from tica.candidate import identify
    from tica.fingerprint import FingerprintCache
    from tica.manifest import load_manifest
    from tica.models.tiny import build_tiny_llama
    from tica.source import checkout_commit

    root = tmp_path_factory.mktemp("cpu-track")
    (root / "demo" / "candidates").mkdir(parents=True)
    shutil.copy(MANIFEST, root / "demo" / "candidates" / MANIFEST.name)
    build_tiny_llama(root / "data" / "models" / "tiny-llama")
    loaded = load_manifest(root / "demo" / "candidates" / MANIFEST.name)
    assert loaded.manifest.source.commit == "working-tree"
    commit = checkout_commit(REPO)
    source = loaded.manifest.source.model_copy(update={"commit": commit})
    loaded = loaded.model_copy(update={"manifest": loaded.manifest.model_copy(update={"source": source})})
    candidate = Candidate.of(loaded, identify(loaded, FingerprintCache(root / "fingerprints.json")))
    return SimpleNamespace(root=root, loaded=loaded, candidate=candidate, commit=commit)


def question(item: str):
    from tica.question import load_question

    return load_question(QUESTIONS / f"{item}.yaml")


def run_producer(item: str, arm: str, out: Path, **params) -> None:
    from tica.legs.runner import leg_command

    argv, env = leg_command(item, arm, out, **params)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{out.name}.log"
    with open(log, "wb") as f:
        proc = subprocess.run(argv, env=env, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=900)
    assert proc.returncode == 0, log.read_text(errors="replace")[-3000:]


def run_item(track, item: str) -> list[Path]:
    """Every leg of the item as the demo's CpuLegRunner runs it (resources/legs.py)."""
    from resources.legs import LegRequest, leg_params, plan_legs, sealed_leg_dirs

    request = LegRequest(track="cpu-tiny", item=EvidenceItem(item), question=question(item), manifest=track.loaded,
                         candidate_id=track.candidate.candidate_id, out_dir=track.root / "legs" / item)
    legs: list[Path] = []
    for spec in plan_legs(request.item, request.question):
        out = request.out_dir / spec.name
        run_producer(item, spec.arm, out, **leg_params(spec, request))
        legs += sealed_leg_dirs(out)
    return legs


def unchanged_checkout(track) -> None:
    """Legs record the checkout they ran from; another engineer's edit while they ran names another
    source, which the binding rightly refuses: not this test's subject."""
    from tica.source import checkout_commit

    if checkout_commit(REPO) != track.commit:
        pytest.skip("the checkout changed while the legs ran: their source binds to no one commit")


@pytest.fixture(scope="module")
def exit_legs(track) -> list[Path]:
    return run_item(track, "clean_exit")


@pytest.fixture(scope="module")
def killed_leg(track) -> Path:
    """The negative control: a BI=0 clean-exit leg whose EngineCore gets SIGKILL before its client."""
    out = track.root / "legs" / "killed" / "bi0"
    run_producer("clean_exit", "bi0", out, model=str(track.loaded.checkpoint_path),
                 shutdown_timeout=track.loaded.manifest.recipe.shutdown_timeout, fault="kill-engine-core")
    return out


def judged(track, item: str, legs):
    from tica.judges import judge

    return judge(item, question(item), legs, track.candidate)


def test_a_served_leg_records_every_value_the_manifest_pins_from_vllms_resolved_config(track, exit_legs):
    from tica.binding import bind_legs

    unchanged_checkout(track)
    (ran,) = [leg for leg in exit_legs if not leg_json(leg)["not_run_reason"]]
    rollout = leg_json(ran)["kernels"]["rollout"]
    print(f"[cpu-track] kernels.rollout of {ran.name}: {rollout}")
    assert "engine_config_note" not in rollout and "engine_config_conflicts" not in rollout
    for key in ("expert_parallel_size", "attention", "async_scheduling", "dtype", "kv_cache_dtype", "prefix_caching",
                "chunked_prefill", "enforce_eager", "tensor_parallel_size", "shutdown_timeout"):
        assert rollout.get(key) is not None, key
    assert bind_legs(exit_legs, track.candidate) == []


def test_clean_exit_and_artifacts_pass_bound_to_the_demo_candidate(track, exit_legs):
    unchanged_checkout(track)
    for item in ("clean_exit", "artifacts"):
        cell = judged(track, item, exit_legs)
        print(f"[cpu-track] {item}: {cell.verdict.value}: {cell.summary}")
        assert cell.verdict is Verdict.PASS, cell.reasons
        assert cell.numbers["binding"] == []


def test_a_leg_with_its_engine_core_force_killed_does_not_pass(track, exit_legs, killed_leg):
    meta = leg_json(killed_leg)
    assert any(p["role"] == "engine_core" and p["end_state"] != "exited" for p in meta["processes"]), meta["processes"]
    for legs in ([killed_leg], [*exit_legs, killed_leg]):
        cell = judged(track, "clean_exit", legs)
        print(f"[cpu-track] clean_exit with the killed leg: {cell.verdict.value}: {cell.summary}")
        assert cell.verdict is Verdict.FAIL, cell.reasons  # bound or not, never a pass


def test_bi1_is_not_run_because_it_needs_a_gpu(exit_legs):
    (bi1,) = [leg for leg in exit_legs if leg_json(leg)["arm"] == "bi1"]
    reason = leg_json(bi1)["not_run_reason"]
    assert reason.startswith(GPU_REASON) and "\n" not in reason and "; " not in reason, reason


@pytest.mark.long
def test_every_demo_producer_binds_and_clean_exit_and_artifacts_pass(track, exit_legs):
    """The full track: every item's legs as the demo plans them (one round per throughput pairing)."""
    legs = {"clean_exit": exit_legs}
    for item in ("forward", "backward", "update", "quality", "throughput"):
        legs[item] = run_item(track, item)
    unchanged_checkout(track)
    for item in ("forward", "backward", "update"):
        cell = judged(track, item, legs[item])
        print(f"[cpu-track] {item}: {cell.verdict.value}: {cell.summary}")
        assert cell.verdict is Verdict.NOT_RUN and any(GPU_REASON in r for r in cell.reasons), cell.reasons
        assert cell.numbers["binding"] == []
    covered = {EvidenceItem.CLEAN_EXIT: [leg for i in COVERS[EvidenceItem.CLEAN_EXIT] for leg in legs[i.value]]
                                        + exit_legs,
               EvidenceItem.ARTIFACTS: [leg for i in COVERS[EvidenceItem.ARTIFACTS] for leg in legs[i.value]]}
    for item, judged_legs in covered.items():
        cell = judged(track, item.value, judged_legs)
        print(f"[cpu-track] {item.value} over {len(judged_legs)} legs: {cell.verdict.value}: {cell.summary}")
        assert cell.verdict is Verdict.PASS, cell.reasons
        assert cell.numbers["binding"] == []
