"""The fuzz suite's starting points and mutations (issue 11).

A clear error or a verdict, never a traceback, never a pass on a corrupted copy of a passing
receipt. Every property starts from a receipt set that passes for one candidate (built once per
session, copied per example), breaks one file, and judges the copy.

Two slices of every property: a CI slice (derandomized, `TICA_FUZZ_CI_EXAMPLES` examples per
property per item, default 25) and a long one (`@pytest.mark.fuzz`, skipped unless
`TICA_FUZZ_EXAMPLES` is set; that many examples in total, spread over the long tests).
"""

from __future__ import annotations

import contextlib
import copy
import io
import itertools
import json
import math
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from tests.bound_receipts import build_bound
from tests.manifests import H200_SHAPED as H200_SHAPED_BASE
from tica.binding import Candidate
from tica.canaries import default_questions
from tica.errors import InputError
from tica.evidence import EvidenceItem
from tica.judges import judge, load_candidate
from tica.question import Question
from tica.verdict import VerdictCell

import yaml

E = EvidenceItem
ITEMS = list(EvidenceItem)

# ---------------------------------------------------------------------------- settings

CI_EXAMPLES = int(os.environ.get("TICA_FUZZ_CI_EXAMPLES", "25"))
LONG_TOTAL = int(os.environ.get("TICA_FUZZ_EXAMPLES") or 0)
# Long tests: properties A and B per item (2 x 7), manifests, questions per item (7), heads, ingest.
LONG_TESTS = 2 * len(ITEMS) + 1 + len(ITEMS) + 2
LONG_EXAMPLES = max(1, LONG_TOTAL // LONG_TESTS)
HANG_SECONDS = int(os.environ.get("TICA_FUZZ_HANG_SECONDS", "20"))

_HEALTH = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large,
           HealthCheck.filter_too_much]

# No explain phase: its line tracer makes the parsers ~50x slower and the hang alarm fire on honest work.
_PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]

CI = settings(max_examples=CI_EXAMPLES, derandomize=True, deadline=None, database=None,
              suppress_health_check=_HEALTH, print_blob=True, phases=_PHASES)
LONG = settings(max_examples=LONG_EXAMPLES, derandomize=False, deadline=None, database=None,
                suppress_health_check=_HEALTH, print_blob=True, phases=_PHASES)
# TICA_FUZZ_PER_KIND=N: N examples for each kind of input (receipts: both properties over every
# item; manifests; questions over every item; published heads; ingest inputs) instead of
# TICA_FUZZ_EXAMPLES spread evenly
PER_KIND = int(os.environ.get("TICA_FUZZ_PER_KIND") or 0)
KIND_TESTS = {"receipts": 2 * len(ITEMS), "manifests": 1, "questions": len(ITEMS), "heads": 1, "ingest": 1}


def long_for(kind: str) -> settings:
    """The long slice's settings for one test of `kind`."""
    if not PER_KIND:
        return LONG
    return settings(LONG, max_examples=-(-PER_KIND // KIND_TESTS[kind]))


# examples each kind ran in this process: the run's summary line (a traceback or a pass on a
# corrupted input fails its test, so a green run's count is the count of inputs without either)
EXAMPLES: dict[str, int] = dict.fromkeys(KIND_TESTS, 0)


def counted(kind: str) -> None:
    EXAMPLES[kind] += 1


long_only = pytest.mark.skipif(not (os.environ.get("TICA_FUZZ_EXAMPLES") or PER_KIND),
                               reason="long fuzz: set TICA_FUZZ_EXAMPLES (total examples) or TICA_FUZZ_PER_KIND to run")


def pytest_terminal_summary(terminalreporter) -> None:
    if any(EXAMPLES.values()):
        terminalreporter.write_line("fuzz examples run in this process: " + ", ".join(
            f"{kind} {n:,}" for kind, n in EXAMPLES.items()) + " (each without a traceback or a pass on a corrupted input, "
            "unless a test above failed)")


# ---------------------------------------------------------------------------- hangs


class Hang(BaseException):
    """Raised by the alarm: a BaseException, so no `except Exception` in the product swallows it."""


@contextlib.contextmanager
def no_hang(seconds: int = HANG_SECONDS, what: str = "") -> Iterator[None]:
    def fire(signum, frame):  # noqa: ARG001
        raise Hang(f"HANG: no answer within {seconds}s {what}")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ---------------------------------------------------------------------------- the passing bases

H200_SHAPED: dict[str, Any] = {**copy.deepcopy(H200_SHAPED_BASE), "track": "fuzz"}


def write_manifest_text(folder: Path, text: str | bytes, name: str = "candidate.yaml") -> Path:
    """A manifest file in `folder` with its checkpoint (ckpt/) beside it."""
    ckpt = folder / "ckpt"
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (ckpt / "config.json").write_text('{"hidden_size": 64}')
    path = folder / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.fixture(scope="session")
def fuzz_root(tmp_path_factory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("fuzz")
    mp = pytest.MonkeyPatch()
    mp.setenv("TICA_CACHE_DIR", str(root / "fingerprint-cache"))
    yield root
    mp.undo()


@pytest.fixture(scope="session")
def questions() -> dict[EvidenceItem, Question]:
    return default_questions()


@pytest.fixture(scope="session")
def candidate(fuzz_root) -> Candidate:
    return load_candidate(write_manifest_text(fuzz_root / "cand", yaml.safe_dump(H200_SHAPED, sort_keys=False)))


class Base:
    """One item's passing receipt set: its root folder and its legs relative to it."""

    def __init__(self, item: EvidenceItem, root: Path, legs: list[Path]) -> None:
        self.item = item
        self.root = root
        self.rel_legs = [leg.relative_to(root) for leg in legs]
        self.files = sorted(p.relative_to(root).as_posix() for leg in legs for p in leg.rglob("*") if p.is_file())
        self._n = itertools.count()

    @contextlib.contextmanager
    def copy(self) -> Iterator[tuple[Path, list[Path]]]:
        """A fresh copy (root, legs), removed afterwards."""
        scratch = Path(tempfile.mkdtemp(prefix=f"{self.item.value}-{next(self._n)}-", dir=self.root.parent.parent))
        try:
            dst = scratch / "r"
            shutil.copytree(self.root, dst)
            yield dst, [dst / rel for rel in self.rel_legs]
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def leg_of(self, rel_file: str) -> str:
        """The leg (relative) holding a file."""
        for rel in self.rel_legs:
            if rel_file.startswith(rel.as_posix() + "/"):
                return rel.as_posix()
        raise LookupError(rel_file)


@pytest.fixture(scope="session")
def bases(fuzz_root, questions, candidate) -> dict[EvidenceItem, Base]:
    """Every item's passing set, built once; each must pass unmutated (the negative control)."""
    out = {}
    for item in ITEMS:
        root = fuzz_root / "bases" / item.value
        legs = build_bound(item, questions[item], candidate, root, compress=False)
        cell = judge(item, questions[item], legs, candidate)
        assert cell.verdict.value == "pass", ("negative control: the unmutated set must pass", item, cell.reasons)
        out[item] = Base(item, root, legs)
    return out


class Ctx:
    """The session's bases, questions and candidate, with a short repr (hypothesis prints it)."""

    def __init__(self, bases, questions, candidate) -> None:
        self.bases, self.questions, self.candidate = bases, questions, candidate

    def __repr__(self) -> str:
        return "ctx"


@pytest.fixture(scope="session")
def ctx(bases, questions, candidate) -> Ctx:
    return Ctx(bases, questions, candidate)


def judged(item: EvidenceItem, question: Question, legs: list[Path], candidate: Candidate | None,
           what: str = "") -> VerdictCell | InputError:
    """A verdict cell or a clear InputError; anything else escapes (a traceback: the test fails)."""
    with no_hang(what=what):
        try:
            cell = judge(item, question, legs, candidate)
        except InputError as err:
            return err
    assert isinstance(cell, VerdictCell), f"judge returned {type(cell).__name__}, not a VerdictCell ({what})"
    return cell


# ---------------------------------------------------------------------------- raw JSON text


class Raw:
    """JSON text written as is (NaN, 1e400, 2**70, 1000-deep nesting ...)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        t = self.text
        return f"Raw({t[:40]!r}{'...' if len(t) > 40 else ''} len={len(t)})"


class Dup:
    """A JSON object written with a duplicate key: `pairs` in order (the last one wins in json.loads)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


def to_text(node: Any, indent: int = 0) -> str:
    if isinstance(node, Raw):
        return node.text
    if isinstance(node, Dup):
        return "{" + ", ".join(f"{json.dumps(k)}: {to_text(v)}" for k, v in node.pairs) + "}"
    if isinstance(node, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {to_text(v)}" for k, v in node.items()) + "}"
    if isinstance(node, (list, tuple)):
        return "[" + ", ".join(to_text(v) for v in node) + "]"
    return json.dumps(node)


def _deep(n: int, open_: str, close: str, inner: str = "1") -> str:
    return open_ * n + inner + close * n


WEIRD_JSON: list[str] = [
    "[]", "{}", '"x"', '""', str(2**70), str(-(2**70)), str(2**64), "NaN", "Infinity", "-Infinity", "null", "true",
    "false", "0", "-1", "0.5", "-0.0", "1e308", "1e400", "-1e400", "1e-400",
    _deep(1000, "[", "]", ""), _deep(1000, '{"a": ', "}"), _deep(100_000, "[", "]", ""),
    '"' + "x" * 100_000 + '"', "1" + "0" * 5000, '[null, "x", 1.5, {}, []]', '"\\ud800"', '"\\u0000"',
    '"2026-13-45T99:99:99"', '"1970-01-01T00:00:00"', '"../../etc/passwd"', '"NaN"', '"inf"', '"-1"', '"1e400"',
    '{"role": [], "exit_code": "0"}', '[[1, 2], [3]]',
]

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                      st.text(max_size=20))
json_values = st.recursive(json_leaf, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                            st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                           max_leaves=10)


def _json_safe_text(v: Any) -> str:
    # Python's json writes NaN / Infinity for non-finite floats, as a careless producer would.
    return json.dumps(v, allow_nan=True)


weird_json = st.one_of(st.sampled_from(WEIRD_JSON), json_values.map(_json_safe_text)).map(Raw)


def node_paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    """Paths (tuples of keys/indices) to every node, the root first."""
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += node_paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += node_paths(v, prefix + (i,))
    return out


def _get(node: Any, path: tuple) -> Any:
    for p in path:
        node = node[p]
    return node


def _replace(root: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    _get(root, path[:-1])[path[-1]] = value
    return root


def mutate_json_value(draw: Callable, obj: Any) -> tuple[Any, str]:
    """One structural change to a parsed JSON value; returns (new value with Raw/Dup nodes, description)."""
    obj = copy.deepcopy(obj)
    paths = node_paths(obj)
    path = draw(st.one_of(st.just(()), st.sampled_from(paths)))
    target = _get(obj, path)
    ops = ["replace", "replace"]
    if isinstance(target, dict):
        ops += ["add_key", "dup_key_weird_wins", "dup_key_orig_wins"] if target else ["add_key"]
        if target:
            ops += ["delete_key", "delete_key"]
    if isinstance(target, list):
        ops += ["append", "drop_item"] if target else ["append"]
    op = draw(st.sampled_from(ops))
    where = "/".join(map(str, path)) or "<root>"
    if op == "replace":
        w = draw(weird_json)
        return _replace(obj, path, w), f"{where} := {w!r}"
    if op == "delete_key":
        k = draw(st.sampled_from(sorted(target)))
        del target[k]
        return obj, f"del {where}/{k}"
    if op == "add_key":
        k = draw(st.one_of(st.sampled_from(["extra", "", "item", "arm", "files", "step", "schema"]), st.text(max_size=6)))
        w = draw(weird_json)
        pairs = list(target.items()) + [(k, w)]
        return _replace(obj, path, Dup(pairs)), f"{where}: add key {k!r} = {w!r}"
    if op in ("dup_key_weird_wins", "dup_key_orig_wins"):
        k = draw(st.sampled_from(sorted(target)))
        w = draw(weird_json)
        pairs = list(target.items())
        pairs = pairs + [(k, w)] if op == "dup_key_weird_wins" else [(k, w)] + pairs
        return _replace(obj, path, Dup(pairs)), f"{where}: duplicate key {k!r} = {w!r} ({op})"
    if op == "append":
        w = draw(weird_json)
        target.append(w)
        return obj, f"{where}: append {w!r}"
    i = draw(st.integers(0, len(target) - 1))
    del target[i]
    return obj, f"{where}: drop item {i}"


# ---------------------------------------------------------------------------- byte mutations

NON_UTF8 = [b"\xff", b"\x80", b"\xc3\x28", b"\xed\xa0\x80", b"\xf0\x28\x8c\x28", b"\xfe\xfe", b"\x00"]


def mutate_bytes(draw: Callable, raw: bytes, destructive_only: bool = False) -> tuple[bytes, str]:
    """One byte-level change that always changes the bytes."""
    ops = ["truncate", "random", "non_utf8", "empty"] if destructive_only else \
        ["flip", "insert", "delete", "truncate", "random", "non_utf8", "empty"]
    if not raw:
        ops = ["insert", "random", "non_utf8"]
    op = draw(st.sampled_from(ops))
    n = len(raw)
    if op == "flip":
        i = draw(st.integers(0, n - 1))
        m = draw(st.integers(1, 255))
        return raw[:i] + bytes([raw[i] ^ m]) + raw[i + 1:], f"flip byte {i} ^ {m:#x}"
    if op == "insert":
        i = draw(st.integers(0, n))
        b = draw(st.binary(min_size=1, max_size=8))
        return raw[:i] + b + raw[i:], f"insert {b!r} at {i}"
    if op == "delete":
        i = draw(st.integers(0, n - 1))
        k = draw(st.integers(1, max(1, min(16, n - i))))
        return raw[:i] + raw[i + k:], f"delete {k} byte(s) at {i}"
    if op == "truncate":
        k = draw(st.integers(0, n - 1))
        return raw[:k], f"truncate to {k} of {n} bytes"
    if op == "random":
        b = draw(st.binary(min_size=0, max_size=256).filter(lambda x: x != raw))
        return b, f"replace with {len(b)} random bytes {b[:16]!r}"
    if op == "non_utf8":
        i = draw(st.integers(0, n))
        b = draw(st.sampled_from(NON_UTF8))
        return raw[:i] + b + raw[i:], f"insert non-UTF-8 {b!r} at {i}"
    return b"", "empty the file"


# ---------------------------------------------------------------------------- structural mutations


def mutate_json_text(draw: Callable, text: str) -> tuple[str, str]:
    obj = json.loads(text)
    new, what = mutate_json_value(draw, obj)
    return to_text(new), what


GARBAGE_LINES = ["{", "not json", "[]", "null", "1", '"row"', "NaN", "{}}", '{"step": }', "\x00", "\ufeff{}",
                 _deep(1000, "[", "]", ""), _deep(100_000, "[", "]", ""), '{"step": 1e400}', '{"step": NaN}']


def mutate_jsonl_text(draw: Callable, text: str) -> tuple[str, str]:
    lines = text.splitlines()
    ops = ["row", "row", "row", "garbage", "insert_garbage", "dup_line", "crlf", "no_final_newline", "blank_lines",
           "empty"]
    if len(lines) > 1:
        ops += ["delete_line", "swap_lines"]
    op = draw(st.sampled_from(ops))
    if not lines:
        op = "insert_garbage"
    i = draw(st.integers(0, max(0, len(lines) - 1)))
    if op == "row":
        try:
            row = json.loads(lines[i])
        except ValueError:
            row = None
        new, what = mutate_json_value(draw, row)
        lines[i] = to_text(new)
        return "\n".join(lines) + "\n", f"line {i + 1}: {what}"
    if op == "garbage":
        g = draw(st.one_of(st.sampled_from(GARBAGE_LINES), st.text(max_size=30).filter(lambda s: "\n" not in s)))
        lines[i] = g
        return "\n".join(lines) + "\n", f"line {i + 1} := {g[:40]!r}"
    if op == "insert_garbage":
        g = draw(st.sampled_from(GARBAGE_LINES))
        lines.insert(i, g)
        return "\n".join(lines) + "\n", f"insert line {i + 1} := {g[:40]!r}"
    if op == "dup_line":
        lines.insert(i, lines[i])
        return "\n".join(lines) + "\n", f"duplicate line {i + 1}"
    if op == "delete_line":
        del lines[i]
        return "\n".join(lines) + "\n", f"delete line {i + 1}"
    if op == "swap_lines":
        j = (i + 1) % len(lines)
        lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines) + "\n", f"swap lines {i + 1} and {j + 1}"
    if op == "crlf":
        return "\r\n".join(lines) + "\r\n", "CRLF line ends"
    if op == "no_final_newline":
        return "\n".join(lines), "no final newline"
    if op == "blank_lines":
        return "\n\n".join(lines) + "\n\n   \n", "blank lines between rows"
    return "", "empty file"


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def mutate_npz(draw: Callable, raw: bytes) -> tuple[bytes, str]:
    with np.load(io.BytesIO(raw), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    key = draw(st.sampled_from(sorted(arrays)))
    a = arrays[key]
    ops = ["truncate", "extend", "dtype", "shape", "scalar", "empty", "nonfinite", "huge", "negative", "delete_key",
           "add_key", "object", "all_arrays_empty"]
    op = draw(st.sampled_from(ops))
    if op == "truncate":
        k = draw(st.integers(0, max(0, a.shape[0] - 1))) if a.ndim else 0
        arrays[key] = a[:k] if a.ndim else a
        what = f"{key}[:{k}]"
    elif op == "extend":
        arrays[key] = np.concatenate([a, a]) if a.ndim else a
        what = f"{key} doubled"
    elif op == "dtype":
        dt = draw(st.sampled_from(["float16", "float64", "int8", "int64", "uint8", "bool", "complex64", "<U4", "S4",
                                   ">f4", ">i4", "float32", "int32"]))
        arrays[key] = a.astype(dt)
        what = f"{key}.astype({dt})"
    elif op == "shape":
        shape = draw(st.sampled_from(["(n,1)", "(1,n)", "(n,1,1)"]))
        arrays[key] = {"(n,1)": a.reshape(-1, 1), "(1,n)": a.reshape(1, -1), "(n,1,1)": a.reshape(-1, 1, 1)}[shape]
        what = f"{key} reshaped {shape}"
    elif op == "scalar":
        arrays[key] = np.array(a.flat[0] if a.size else 0, dtype=a.dtype)
        what = f"{key} 0-d scalar"
    elif op == "empty":
        arrays[key] = a[:0]
        what = f"{key} empty"
    elif op == "nonfinite":
        v = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
        b = a.astype(np.float32 if a.dtype.kind != "f" else a.dtype).copy()
        if b.size:
            b.flat[draw(st.integers(0, b.size - 1))] = v
        arrays[key] = b
        what = f"{key} with a {v} (dtype {b.dtype})"
    elif op == "huge":
        info = np.iinfo(a.dtype) if a.dtype.kind in "iu" else None
        b = a.copy()
        if b.size:
            b.flat[draw(st.integers(0, b.size - 1))] = info.max if info else (np.finfo(a.dtype).max if a.dtype.kind == "f" else True)
        arrays[key] = b
        what = f"{key} with a maximal value"
    elif op == "negative":
        b = a.copy()
        if b.size and b.dtype.kind in "if":
            b.flat[draw(st.integers(0, b.size - 1))] = -1 if b.dtype.kind == "i" else -1e30
        arrays[key] = b
        what = f"{key} with a negative value"
    elif op == "delete_key":
        del arrays[key]
        what = f"delete array {key}"
    elif op == "add_key":
        arrays["extra"] = np.arange(3)
        what = "add array 'extra'"
    elif op == "object":
        arrays[key] = np.array([None, "x"], dtype=object)
        what = f"{key} as a pickled object array"
    else:
        arrays = {k: v[:0] if v.ndim else v for k, v in arrays.items()}
        what = "every array empty"
    return _npz_bytes(arrays), what
