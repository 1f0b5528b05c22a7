"""Stands in for a producer (`python -m tica.legs.<item>`) in the Pipes test: the same command
line, Pipes opened the same way, a small sealed leg instead of a vLLM run."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from dagster_pipes import open_dagster_pipes

from tica.seal import seal_leg


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--arm", required=True)
    args, rest = ap.parse_known_args()
    with open_dagster_pipes() as pipes:
        out = Path(args.out)
        out.mkdir(parents=True)
        flags = dict(zip(rest[::2], rest[1::2]))
        meta = {"schema": "tica.leg/1", "item": "forward", "arm": args.arm, "flags": flags,
                "env": {"VLLM_BATCH_INVARIANT": os.environ.get("VLLM_BATCH_INVARIANT")},
                "processes": [], "not_run_reason": None}
        (out / "leg.json").write_text(json.dumps(meta))
        seal_leg(out)
        pipes.log.info(f"fake leg {args.arm} sealed in {out}")
        pipes.report_custom_message({"leg_dir": str(out)})


if __name__ == "__main__":
    main()
