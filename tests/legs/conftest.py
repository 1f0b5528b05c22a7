"""One full demo leg set on the tiny model, produced once per session and shared by the tests
that assert on it (vLLM engine starts are the cost: about a minute each on two CPU cores). Those
tests live in one file, test_legs_cpu.py: `--dist loadfile` gives a file to one worker, so the set
is made once per run, not once per worker that has a test of it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest


def _legs_root(tmp_path_factory) -> Path:
    keep = os.environ.get("TICA_TEST_LEGS_ROOT")  # reuse a produced set while iterating on tests
    return Path(keep) if keep else tmp_path_factory.mktemp("tica-legs")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from tica.models.tiny import build_tiny_llama

    return build_tiny_llama(_legs_root(tmp_path_factory) / "models" / "tiny-llama")


@pytest.fixture(scope="session")
def demo_legs(tmp_path_factory, tiny_model) -> dict:
    from tica.legs.runner import run_demo_legs, throughput_leg_dirs

    root = tiny_model.parents[1] / "demo"
    done = root / "done.json"
    if done.is_file():  # TICA_TEST_LEGS_ROOT reuse
        data = json.loads(done.read_text())
        return {"legs": {k: [Path(p) for p in v] for k, v in data["legs"].items()}, "seconds": data["seconds"], "root": root}
    t0 = time.time()
    legs = run_demo_legs(root, model=tiny_model, concurrencies=(1, 2), rounds=2, input_len=64, output_len=16,
                         num_prompts=6, num_warmups=1, quality_limit=10, length_cap=32, vllm_engine_forward=True,
                         on_leg=lambda i, a, d: print(f"[legs] {i} {a} {d}", flush=True))
    seconds = time.time() - t0
    done.write_text(json.dumps({"legs": {k: [str(p) for p in v] for k, v in legs.items()}, "seconds": seconds}))
    return {"legs": legs, "seconds": seconds, "root": root}


def leg_json(leg_dir: Path) -> dict:
    return json.loads((leg_dir / "leg.json").read_text())


def by_arm(dirs, arm):
    return [d for d in dirs if leg_json(d)["arm"] == arm]


def metrics(leg_dir: Path, name: str = "metrics.jsonl") -> list[dict]:
    return [json.loads(x) for x in (leg_dir / name).read_text().splitlines() if x.strip()]
