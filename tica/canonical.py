"""One canonical form per manifest field: what fingerprint, diff and binding all compare.

A manifest is read into these forms when it is loaded (tica.manifest), so a component's
fingerprint, the diff between two candidates and binding against a receipt never disagree on
whether two spellings are one value. Each normalisation here is explicit and tested
(tests/core/test_canonical.py); any spelling not named here is compared exactly.

- digests: case and a bare sha256 (`tica.digests`)
- commits: case (`abc1234` and `ABC1234`); a prefix names a commit only where binding compares it
- dtypes: `bf16` = `bfloat16` = `torch.bfloat16`, `fp16` = `half` = `float16`, `fp32` = `float` = `float32`
- package pins: `vllm == v0.26.0` = `vllm==0.26.0`
- unordered lists: concurrencies, CUDA graph capture sizes and stop sequences, as sets, sorted
- a request count per concurrency that is one number everywhere: that number
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from tica import digests

DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16", "half": "float16",
          "fp32": "float32", "float32": "float32", "float": "float32"}
_PIN = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*==\s*v?([^\s;]+)\s*$")


def digest(value: str) -> str:
    return digests.canonical(value)


def commit(value: str) -> str:
    return value.strip().lower()


def dtype(value: str) -> str:
    """A dtype in torch's name; a value that is no dtype alias (`auto`, `fp8_e4m3`) lower-cased."""
    word = value.strip().lower().removeprefix("torch.")
    return DTYPES.get(word, word)


def package_pin(value: str) -> str:
    """`name==version` without spaces or a leading v; anything else (a trainer named by kind,
    `vllm_kernels`) stripped."""
    m = _PIN.match(value)
    return f"{m.group(1)}=={m.group(2)}" if m else value.strip()


def version(value: Any) -> str:
    return str(value).strip().removeprefix("v")


def unordered(values: Iterable[Any]) -> tuple[Any, ...]:
    return tuple(sorted(set(values)))


def per_concurrency(counts: int | dict[int, int]) -> int | dict[int, int]:
    if isinstance(counts, dict):
        values = set(counts.values())
        return values.pop() if len(values) == 1 else dict(sorted(counts.items()))
    return counts
