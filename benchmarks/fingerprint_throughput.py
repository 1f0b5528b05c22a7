"""Fingerprint throughput of a multi-GB checkpoint-like file set, side by side with b3sum and
sha256sum, and the time of a re-fingerprint with a warm cache.

    .venv/bin/python benchmarks/fingerprint_throughput.py --gb 4 --files 8

Every tool reads the same files after one warm-up read, so all run from the page cache: the
ratio compares hashing, not the disk. b3sum comes from Debian's `b3sum` package; a tool that is
missing is reported as such, never silently skipped.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from tica.fingerprint import RACY_WINDOW_NS, FingerprintCache, fingerprint_checkpoint

CHUNK = 1 << 24


def make_files(root: Path, total_bytes: int, count: int) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    per = total_bytes // count
    block = os.urandom(CHUNK)
    paths = []
    for i in range(count):
        path = root / f"model-{i:05d}-of-{count:05d}.safetensors"
        with open(path, "wb") as f:
            left = per
            while left > 0:
                n = min(left, CHUNK)
                f.write(block[:n])
                left -= n
        # a checkpoint at rest: its mtime is older than the racy window
        old = (time.time_ns() - 10 * RACY_WINDOW_NS) / 1e9
        os.utime(path, (old, old))
        paths.append(path)
    return paths


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_tool(tool: str, paths: list[Path]) -> float | None:
    exe = shutil.which(tool)
    if exe is None:
        return None
    return timed(lambda: subprocess.run([exe, *map(str, paths)], check=True, stdout=subprocess.DEVNULL))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=4.0, help="total size of the file set")
    parser.add_argument("--files", type=int, default=8, help="number of shards")
    parser.add_argument("--dir", default=None, help="where to write the files (default: a temp folder on disk)")
    args = parser.parse_args()

    work = Path(args.dir or tempfile.mkdtemp(prefix="tica-fp-bench-", dir=os.environ.get("TMPDIR", "/var/tmp")))
    total = int(args.gb * (1 << 30))
    try:
        paths = make_files(work / "ckpt", total, args.files)
        gib = total / (1 << 30)
        timed(lambda: [p.read_bytes() for p in paths])  # warm the page cache for every tool alike

        cache_file = work / "cache.json"
        cold = timed(lambda: fingerprint_checkpoint(work / "ckpt", FingerprintCache(cache_file)))
        warm_cache = FingerprintCache(cache_file)
        fingerprint_checkpoint(work / "ckpt", warm_cache)
        warm_cache.save()
        reread = FingerprintCache(cache_file)
        warm = timed(lambda: fingerprint_checkpoint(work / "ckpt", reread))
        assert reread.misses == 0, "warm re-fingerprint hashed a file again"

        rows = [("tica (blake3, mmap, threads)", cold)]
        for tool in ("b3sum", "sha256sum"):
            rows.append((tool, run_tool(tool, paths)))

        print(f"file set: {args.files} files, {gib:.2f} GiB, {os.cpu_count()} CPUs")
        print(f"{'tool':<30} {'seconds':>9} {'GiB/s':>8} {'time vs tica':>13}")
        for name, secs in rows:
            if secs is None:
                print(f"{name:<30} {'missing':>9} (apt-get install {name.split()[0]})")
                continue
            print(f"{name:<30} {secs:9.3f} {gib / secs:8.2f} {secs / cold:12.2f}x")
        print(f"warm-cache re-fingerprint: {warm * 1000:.1f} ms for {gib:.2f} GiB ({args.files} files, 0 re-hashed)")
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
