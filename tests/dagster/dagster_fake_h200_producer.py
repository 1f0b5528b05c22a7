"""Stands in for `tica.legs.vllm_kernels.producers` in the GPU runner's fast tests: the same
commands and flags, unsealed legs written through the producers' own legio (so leg.json records
the environment the child saw), and a pause of TICA_FAKE_PRODUCER_S seconds in place of vLLM."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tica.legs.vllm_kernels import legio

LEGS = {
    "bi1": ("forward_bi1", "forward_bi1_decode", "forward_bi1_decode_post_update", "backward_bi1", "update_bi1"),
    "bi0": ("forward_bi0_hf",),
    "bi0-megatron": ("forward_bi0_megatron",),
}


def say(msg: str) -> None:
    print(f"[tica {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd")
    ap.add_argument("--out")
    ap.add_argument("--model")
    ap.add_argument("--legs")
    ap.add_argument("--work")
    ap.add_argument("--shape")
    ap.add_argument("--seed")
    ap.add_argument("--device")
    ap.add_argument("--rollouts")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args()
    pause = float(os.environ.get("TICA_FAKE_PRODUCER_S", "0"))
    if a.cmd == "make-model":
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "tica_model.json").write_text(json.dumps({"weights_hash": "sha256:" + "0" * 64, "shape": a.shape}))
        say(f"model {out}")
        return 0
    say(f"{a.cmd} starts on CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}")
    time.sleep(pause)
    if a.cmd == "bi0":
        Path(a.rollouts).write_text("[]")
    elif a.cmd == "bi0-megatron" and not Path(a.rollouts).is_file():
        raise SystemExit(f"no rollouts at {a.rollouts}")
    for name in LEGS[a.cmd]:
        d = Path(a.legs) / name
        (d / "arrays").mkdir(parents=True, exist_ok=True)
        meta = legio.new_meta(name.split("_")[0], a.cmd.split("-")[0], trainer="vllm_kernels")  # the arm: bi1 or bi0
        legio.write_meta(d, meta)
        say(f"{name} written")
    return int(os.environ.get("TICA_FAKE_PRODUCER_RC", "0"))


if __name__ == "__main__":
    sys.exit(main())
