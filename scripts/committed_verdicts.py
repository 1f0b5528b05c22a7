"""Print the verdict of every committed receipt set, one line each, to compare judge versions.

    .venv/bin/python scripts/committed_verdicts.py > after.txt

Covers the synthetic fixtures (tests/fixtures/receipts, criteria alone), the H200 tracks
(h200-mid4 and h200-mid4-tp2, bound to their manifests; each item's newest replayed run), the
basis tracks (h200-smollm2, h200-tput: every run) and the shape/load matrix (cells per verdict).
CHANGELOG.md lists what moved between judge versions, from two runs of this script.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tica.judges import expand_receipts, judge, judge_criteria, load_candidate  # noqa: E402
from tica.judges.matrix import matrix_cells  # noqa: E402
from tica.messages import clip  # noqa: E402
from tica.question import load_question  # noqa: E402
from tica.receipt_archive import unpacked  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
QUESTIONS = ROOT / "demo" / "questions"
CANDIDATES = ROOT / "demo" / "candidates"
ITEMS = ("forward", "backward", "update", "quality", "throughput", "clean_exit", "artifacts")


def line(name: str, cell) -> str:
    summary = cell.summary.split(": ", 1)[-1].replace(f"{ROOT}/", "")
    return f"{name}: {cell.verdict.value} | {clip(summary, 160)}"


def synthetic() -> list[str]:
    out = []
    receipts = FIXTURES / "receipts"
    for item in ITEMS[:-1]:
        q = load_question(receipts / "questions" / f"{item}.yaml")
        out.append(line(f"fixtures/{item}", judge_criteria(item, q, expand_receipts([receipts / item]))))
    q = load_question(receipts / "questions" / "throughput.yaml")
    out.append(line("fixtures/bare_bench", judge_criteria("throughput", q, expand_receipts([receipts / "bare_bench"]))))
    return out


def h200_tracks() -> list[str]:
    out = []
    h200 = FIXTURES / "h200"
    selection = yaml.safe_load((h200 / "replay.yaml").read_text())
    candidate = load_candidate(CANDIDATES / "h200-mid4.yaml")
    for item, runs in selection.items():
        if item not in ITEMS or not runs:
            continue
        legs = [p for pattern in runs[-1]["legs"] for p in sorted(h200.glob(pattern))]
        q = load_question(QUESTIONS / "h200-mid4" / f"{item}.yaml")
        out.append(line(f"h200-mid4/{item} ({runs[-1]['run']})", judge(item, q, legs, candidate)))
    tp2 = yaml.safe_load((h200 / "run5" / "replay.yaml").read_text())
    candidate = load_candidate(CANDIDATES / "h200-mid4-tp2.yaml")
    for item, names in tp2.items():
        if names:
            q = load_question(QUESTIONS / "h200-mid4-tp2" / f"{item}.yaml")
            out.append(line(f"h200-mid4-tp2/{item}", judge(item, q, [h200 / "run5" / n for n in names], candidate)))
    return out


def basis_and_matrix(tmp: Path) -> list[str]:
    out = []
    basis = unpacked(FIXTURES / "h200" / "basis.tar.xz", tmp / "basis")
    for track in ("h200-smollm2", "h200-tput"):
        candidate = load_candidate(CANDIDATES / f"{track}.yaml")
        for item, runs in yaml.safe_load((basis / track / "replay.yaml").read_text()).items():
            if not runs:
                continue
            q = load_question(QUESTIONS / track / f"{item}.yaml")
            for run in runs:
                legs = [p for pattern in run["legs"] for p in sorted((basis / track).glob(pattern))]
                out.append(line(f"{track}/{item} ({run['run']})", judge(item, q, legs, candidate)))
    for archive in ("matrix", "matrix_moe", "matrix_fp8", "matrix_fp8b", "matrix_fp8bc"):
        matrix = unpacked(FIXTURES / "h200" / f"{archive}.tar.xz", tmp / archive)
        cells = matrix_cells(load_question(QUESTIONS / "h200-matrix" / "forward.yaml"), matrix)
        counts = Counter((c.run, c.verdict.value) for c in cells)
        out += [f"matrix/{run}: {verdict} x {n}" for (run, verdict), n in sorted(counts.items())]
    return out


def verdict_lines() -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        return [*synthetic(), *h200_tracks(), *basis_and_matrix(Path(tmp))]


def main() -> None:
    print("\n".join(verdict_lines()))


if __name__ == "__main__":
    main()
