"""`tica candidate fingerprint` on an unchanged checkpoint, as a whole process, side by side with
`dvc status` on the same tree (and the interpreter's own start as the floor).

    .venv/bin/python benchmarks/fingerprint_startup.py --gb 100 --files 20 --repeats 7 --dvc /path/to/dvc

The checkpoint's files are sparse (no disk is written) and both tools have hashed them once before
the timed runs, so every timed run only stats the tree: what is compared is each command's start-up
and its check of an unchanged tree. Target: the ratio tica / dvc under 0.3. A dvc that is missing
is reported as such, never silently skipped.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TICA = Path(sys.executable).parent / "tica"


def sparse_checkpoint(root: Path, total_bytes: int, count: int) -> Path:
    ck = root / "checkpoint"
    ck.mkdir(parents=True)
    for i in range(count):
        with open(ck / f"model-{i:05d}-of-{count:05d}.safetensors", "wb") as f:
            f.truncate(total_bytes // count)
    old = time.time() - 3600  # at rest: older than the fingerprint cache's racy window
    for path in ck.iterdir():
        os.utime(path, (old, old))
    return ck


def manifest_for(root: Path, checkpoint: Path) -> Path:
    text = (ROOT / "demo" / "candidates" / "cpu-tiny.yaml").read_text()
    text = text.replace("../../data/models/tiny-llama", str(checkpoint))
    path = root / "candidate.yaml"
    path.write_text(text)
    return path


def wall(cmd: list[str], repeats: int, cwd: Path, env: dict[str, str]) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=100.0)
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--dvc", default=shutil.which("dvc"), help="the dvc executable (default: dvc on PATH)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ck = sparse_checkpoint(root, int(args.gb * 2**30), args.files)
        manifest = manifest_for(root, ck)
        env = {**os.environ, "TICA_CACHE_DIR": str(root / "cache")}
        tica = [str(TICA), "candidate", "fingerprint", str(manifest)]
        subprocess.run(tica, env=env, stdout=subprocess.DEVNULL, check=True)  # hashes once, fills the cache
        rows = {"python -c pass (floor)": wall([sys.executable, "-c", "pass"], args.repeats, root, env),
                "tica candidate fingerprint": wall(tica, args.repeats, root, env)}
        if args.dvc:
            for step in (["init", "--no-scm", "-q"], ["add", "-q", "checkpoint"]):
                subprocess.run([args.dvc, *step], cwd=root, env=env, stdout=subprocess.DEVNULL, check=True)
            rows["dvc status"] = wall([args.dvc, "status", "-q"], args.repeats, root, env)
    print(f"unchanged tree: {args.files} sparse files, {args.gb:g} GiB; median of {args.repeats} whole-process runs")
    for name, t in rows.items():
        print(f"  {name:30} {t * 1e3:8.0f} ms")
    if "dvc status" in rows:
        print(f"  ratio tica / dvc: {rows['tica candidate fingerprint'] / rows['dvc status']:.2f} (target < 0.3)")
    else:
        print("  dvc: not found (pass --dvc PATH); no ratio")


if __name__ == "__main__":
    main()
