"""Stands in for a leg producer (`python -m tica.legs.<item> --out OUT --arm ARM ...`) as the
entrypoint of a Ray job: the same command line (plus `--item`, which RayLegRunner's
producer_module passes), Dagster Pipes opened the same way, and one leg's passing receipt for
the frozen question instead of a vLLM run -- tica.canaries' builders bound to the candidate
(tests/bound_receipts.py), the leg(s) of this arm and round only, written the way a producer
writes them: its `TICA_*` environment recorded in leg.json's env (as tica.legs.common does),
sealed last.

Environment (set through RayLegRunner.env): TICA_FAKE_PROJECT, the test project's root (its
candidates/ and questions/); TICA_FAKE_SLEEP=`item:arm:seconds`, that leg sleeps before it seals,
having written its pid to `<out>.pid` (the node-loss test kills it with its node)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from dagster_pipes import open_dagster_pipes


def _recorded_env() -> dict[str, str]:
    from tica.legs.common import recorded_env

    return recorded_env()


def build(item: str, arm: str, round_: int | None, out: Path) -> list[Path]:
    from tests.bound_receipts import build_bound
    from tica.binding import Candidate
    from tica.canaries import synthetic_identity
    from tica.candidate import identify
    from tica.evidence import EvidenceItem
    from tica.manifest import load_manifest
    from tica.question import load_question
    from tica.seal import seal_leg

    project = Path(os.environ["TICA_FAKE_PROJECT"])
    loaded = load_manifest(next((project / "candidates").glob("*.yaml")))
    question = load_question(project / "questions" / f"{item}.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        legs = build_bound(EvidenceItem(item), question, Candidate.of(loaded, identify(loaded)), Path(tmp))
        mine = [leg for leg in legs if (m := json.loads((leg / "leg.json").read_text()))["arm"] == arm
                and (round_ is None or m.get("round") == round_)]
        relabel = not mine  # the passing set has no leg of this arm (update: BI=1's only): the other's, relabelled
        if relabel:
            mine = [leg for leg in legs if round_ is None or json.loads((leg / "leg.json").read_text()).get("round") == round_]
        if item == "throughput":
            targets = [(leg, out / f"c{json.loads((leg / 'leg.json').read_text())['concurrency']}") for leg in mine]
        else:
            assert len(mine) == 1, [p.name for p in mine]
            targets = [(mine[0], out)]
        written = []
        for src, dest in targets:
            shutil.copytree(src, dest, dirs_exist_ok=True)
            meta = json.loads((dest / "leg.json").read_text())
            meta["env"] = {**meta.get("env", {}), **_recorded_env()}
            if relabel:
                meta["arm"] = arm
                meta["env"]["VLLM_BATCH_INVARIANT"] = "1" if arm == "bi1" else "0"
                # a run of its own: its processes are not the copied leg's (the clean-exit judge
                # counts a process recorded in two arms once)
                for proc in meta["processes"]:
                    proc["identity"] = synthetic_identity(proc["role"], proc["pid"], arm)
            (dest / "leg.json").write_text(json.dumps(meta, indent=1))
            seal_leg(dest)
            written.append(dest)
    return written


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--item", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--arm", required=True)
    ap.add_argument("--round", type=int)
    args, _ = ap.parse_known_args()
    out = Path(args.out)
    with open_dagster_pipes() as pipes:
        sleep = os.environ.get("TICA_FAKE_SLEEP", "")
        if sleep:
            item, arm, seconds = sleep.split(":")
            if (item, arm) == (args.item, args.arm):
                out.parent.mkdir(parents=True, exist_ok=True)
                out.with_name(out.name + ".pid").write_text(str(os.getpid()))
                pipes.log.info(f"fake {args.item} leg {args.arm}: working for {seconds} s")
                time.sleep(float(seconds))
        legs = build(args.item, args.arm, args.round, out)
        pipes.log.info(f"fake {args.item} leg {args.arm} on node {os.environ.get('TICA_NODE')}: sealed {len(legs)} leg(s)")
        pipes.report_custom_message({"legs": [str(p) for p in legs], "node": os.environ.get("TICA_NODE")})


if __name__ == "__main__":
    main()
