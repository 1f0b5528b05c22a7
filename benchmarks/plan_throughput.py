"""`tica plan throughput` over a large pilot: 1000 sealed legs on disk, the plan timed.

    .venv/bin/python benchmarks/plan_throughput.py --legs 1000 --repeat 3

Builds the legs once (125 crossed rounds x 4 concurrencies x 2 arms, the canaries' formats,
each BI=1 leg's loss drawn around 0.05 with SD 0.02), then times the whole plan as the command
runs it after start-up: expand the folder, read and check every leg (seal, workload, exits,
order), pair the rounds, plan the rounds per concurrency, validate and write the draft. Imports
(scipy, pydantic) are timed apart: they are paid once per process. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import io
import re
import statistics
import tempfile
import time
from pathlib import Path

_t0 = time.perf_counter()
import numpy as np  # noqa: E402
import yaml  # noqa: E402

from tica.canaries import build_throughput, default_questions, scale_throughput  # noqa: E402
from tica.evidence import EvidenceItem  # noqa: E402
from tica.cli.plan import build_parser, run  # noqa: E402
import tica.stats.plan  # noqa: E402,F401  (what `tica plan` imports when it runs: scipy.stats)
from tica.question import parse_question  # noqa: E402

IMPORT_S = time.perf_counter() - _t0
_NAME = re.compile(r"tput_c(\d+)_r(\d+)_s\d_(bi[01])$")


def build(dest: Path, legs: int, seed: int = 0) -> Path:
    """legs // 8 crossed rounds of every concurrency; returns the question file."""
    rounds = max(legs // 8, 2)
    data = default_questions()[EvidenceItem.THROUGHPUT].model_dump(mode="json")
    data.update(repeats=rounds, pairing_order=["AB" if i % 2 == 0 else "BA" for i in range(rounds)])
    data["criteria"]["statistical_basis"] = None  # a pilot's question carries no basis: the plan writes one
    question = parse_question(data)
    qpath = dest / "question.yaml"
    qpath.write_text(yaml.safe_dump(question.model_dump(mode="json")))
    rng = np.random.default_rng(seed)
    paths = build_throughput(question, dest / "legs", loss={c: 0.0 for c in question.criteria.concurrencies})
    for p in paths:
        if _NAME.search(p.name).group(3) == "bi1":  # type: ignore[union-attr]
            scale_throughput(p, 1.0 - float(np.clip(rng.normal(0.05, 0.02), -0.2, 0.5)))
    return qpath


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--legs", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3, help="timed runs (the best and the median are printed)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        qpath = build(root, args.legs)
        n = sum(1 for _ in (root / "legs").iterdir())
        print(f"built {n} sealed pilot legs in {time.perf_counter() - t:.2f} s")
        argv = ["plan", "throughput", str(root / "legs"), "-q", str(qpath), "--budget", "0.10",
                "--out", str(root / "draft.yaml"), "--json"]
        times = []
        for _ in range(args.repeat):
            out = io.StringIO()
            t = time.perf_counter()
            rc = run(build_parser().parse_args(argv), out=out)
            times.append(time.perf_counter() - t)
            assert rc == 0, out.getvalue()
        print(f"imports (once per process): {IMPORT_S:.2f} s")
        print(f"tica plan throughput on {n} legs: best {min(times):.3f} s, median {statistics.median(times):.3f} s "
              f"over {len(times)} runs")


if __name__ == "__main__":
    main()
