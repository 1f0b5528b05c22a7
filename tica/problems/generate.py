"""Generate the shipped arithmetic sets: `python -m tica.problems.generate arith1000`.

A set's version is the sha256 of its file (tica.problems.load_problems), so a set is
regenerated only to reproduce it: the same name gives the same bytes (a seeded generator;
`tests/core/test_problems.py` checks the committed file against it).

arith1000 is sized for `tica plan quality` to decide a 5-point threshold: an exact McNemar
equivalence at alpha 0.05 and power 0.8 needs about 672 paired problems at 10% discordance
(docs/statistics.md). arith30 stays the quick demo's set.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from tica.problems import HERE

SIZES = {"arith1000": 1000}


def problems(n: int, seed: int) -> list[dict[str, str]]:
    """Two-operand integer problems: + and - on 1..99, x on 2..19; answers are integers."""
    rng = random.Random(seed)
    out, seen = [], set()
    while len(out) < n:
        op = rng.choice("+-x")
        a, b = (rng.randint(2, 19), rng.randint(2, 19)) if op == "x" else (rng.randint(1, 99), rng.randint(1, 99))
        if (a, op, b) in seen:
            continue
        seen.add((a, op, b))
        answer = a + b if op == "+" else a - b if op == "-" else a * b
        out.append({"problem_id": f"p{len(out) + 1:04d}", "question": f"What is {a} {'*' if op == 'x' else op} {b}?",
                    "answer": str(answer)})
    return out


def text(name: str) -> str:
    return "".join(json.dumps(p) + "\n" for p in problems(SIZES[name], seed=sum(map(ord, name))))


def main(argv: list[str]) -> int:
    for name in argv or list(SIZES):
        path = Path(HERE) / f"{name}.jsonl"
        path.write_text(text(name))
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
