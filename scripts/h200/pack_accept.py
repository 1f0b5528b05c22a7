"""Pack the h200-accept receipts (issue 31) into tests/fixtures/h200/accept.tar.xz.

    .venv/bin/python scripts/h200/pack_accept.py --frozen DIR --calls DIR --replay DIR \
        --run run10=/tmp/a10/run10/{cand} --run run11=/tmp/r11/{cand}/h200 [--run ...]

To add a run to the committed archive, unpack it, link `overlay3` and `stock` to its track folders,
and name its runs from there beside the new one.

Each `--run NAME=PATTERN` names a device call's sealed legs, `{cand}` standing for overlay3 and
stock. The archive holds one track folder per candidate (h200-accept: overlay3, h200-accept-stock:
stock), each run as `<track>/<run>/<leg>/` with the freeze proof beside its legs
(`<track>/<run>/frozen/`: the freezing ledger's chain export and its signed head, from --frozen,
or, for a run repacked from an earlier archive, the proof it shipped with), the track's
`replay.yaml` (`--replay DIR`: `<track>.yaml` files), and the calls' logs under `calls/`. Only the legs a track's evidence or its
canaries use are kept: the rest (prefill-scored probes) stay in the calls' logs.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

TRACKS = {"overlay3": "h200-accept", "stock": "h200-accept-stock"}
KEEP = ("forward_bi1_decode", "forward_bi1_decode_post_update", "forward_bi0_hf", "forward_bi0_megatron",
        "forward_bi1_planted_fault", "backward_bi1", "update_bi1", "quality_bi1", "quality_bi0", "throughput_*")
FROZEN = ("chain.jsonl", "head.json")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", action="append", required=True, help="NAME=PATTERN, {cand} for the candidate")
    ap.add_argument("--frozen", required=True, type=Path, help="folder with chain.jsonl and head.json")
    ap.add_argument("--replay", required=True, type=Path, help="folder with <track>.yaml replay selections")
    ap.add_argument("--calls", type=Path, default=None, help="folder of the calls' logs, copied to calls/")
    ap.add_argument("--out", type=Path, default=Path("tests/fixtures/h200/accept.tar.xz"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for cand, track in TRACKS.items():
            shutil.copy(a.replay / f"{track}.yaml", (root / track).mkdir(parents=True) or root / track / "replay.yaml")
            for spec in a.run:
                name, pattern = spec.split("=", 1)
                src = Path(pattern.format(cand=cand))
                legs = sorted({p for keep in KEEP for p in src.glob(keep) if (p / "seal.json").is_file()})
                if not legs:
                    continue
                run = root / track / name
                for leg in legs:
                    shutil.copytree(leg, run / leg.name)
                # a run repacked from an earlier archive keeps the proof it shipped with (the head its
                # legs ran after); a new run gets --frozen's
                proof = src / "frozen" if all((src / "frozen" / f).is_file() for f in FROZEN) else a.frozen
                (run / "frozen").mkdir()
                for f in FROZEN:
                    shutil.copy(proof / f, run / "frozen" / f)
        if a.calls:
            shutil.copytree(a.calls, root / "calls")
        a.out.parent.mkdir(parents=True, exist_ok=True)
        # sorted names and fixed owners and times: the same receipts pack to the same bytes
        files = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
        subprocess.run(["tar", "--owner=0", "--group=0", "--numeric-owner", "--mtime=2026-12-05 00:00Z",
                        "--no-recursion", "-C", str(root), "-cJf", str(a.out.resolve()), *files], check=True)
    print(f"{a.out}: {a.out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
