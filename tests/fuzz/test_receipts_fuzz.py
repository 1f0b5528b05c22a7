"""Receipts under fuzz (issue 11): a clear error or a verdict, never a traceback, never a pass on a
corrupted copy of a passing receipt.

A (integrity): one file of one leg changed byte-wise, removed, or joined by another, WITHOUT
  resealing: the verdict is never `pass`.
B (robustness): one file changed structurally and RESEALED, as a buggy producer would: `judge`
  returns a VerdictCell (any verdict) or raises only `tica.errors.InputError`, within the alarm.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from tica.errors import InputError
from tica.seal import SEAL_FILE, seal_leg
from tica.verdict import Verdict, VerdictCell

from .conftest import (CI, ITEMS, Raw, _deep, counted, judged, long_for, long_only, mutate_bytes, mutate_json_text,
                       mutate_jsonl_text, mutate_npz, to_text)

pytestmark = pytest.mark.filterwarnings("ignore")


def _not_pass(result, what: str) -> None:
    if isinstance(result, VerdictCell):
        assert result.verdict is not Verdict.PASS, f"FALSE PASS on a corrupted copy: {what}\n{result.summary}"


# ---------------------------------------------------------------------------- A: integrity


def integrity(item, data, ctx) -> None:
    bases, questions, candidate = ctx.bases, ctx.questions, ctx.candidate
    base = bases[item]
    rel = data.draw(st.sampled_from(base.files), label="file")
    with base.copy() as (root, legs):
        path = root / rel
        op = data.draw(st.sampled_from(["bytes"] * 8 + ["remove", "add_beside", "dir_instead"]), label="kind")
        if op == "bytes":
            new, what = mutate_bytes(data.draw, path.read_bytes(), destructive_only=path.name == SEAL_FILE)
            path.write_bytes(new)
        elif op == "remove":
            path.unlink()
            what = "file removed"
        elif op == "add_beside":
            (path.parent / "extra.json").write_text("{}")
            what = "an unsealed extra.json added beside it"
        else:
            path.unlink()
            path.mkdir()
            what = "replaced by a directory"
        what = f"{item.value}: {rel}: {what} (not resealed)"
        note(what)
        _not_pass(judged(item, questions[item], legs, candidate, what), what)


@pytest.mark.parametrize("item", ITEMS, ids=lambda i: i.value)
@CI
@given(data=st.data())
def test_integrity_ci(item, data, ctx):
    integrity(item, data, ctx)


@pytest.mark.fuzz
@long_only
@pytest.mark.parametrize("item", ITEMS, ids=lambda i: i.value)
@long_for("receipts")
@given(data=st.data())
def test_integrity_long(item, data, ctx):
    counted("receipts")
    integrity(item, data, ctx)


# ---------------------------------------------------------------------------- B: robustness


def structural(draw, path: Path) -> str:
    """Change one file as a buggy producer would; returns what was done."""
    raw = path.read_bytes()
    if draw(st.integers(0, 9), label="raw?") == 0:  # a producer that writes garbage bytes and seals them
        new, what = mutate_bytes(draw, raw)
        path.write_bytes(new)
        return what
    if path.suffix == ".npz":
        new, what = mutate_npz(draw, raw)
        path.write_bytes(new)
        return what
    if path.suffix == ".jsonl":
        text, what = mutate_jsonl_text(draw, raw.decode())
    else:
        text, what = mutate_json_text(draw, raw.decode())
    path.write_text(text)
    return what


def robustness(item, data, ctx) -> None:
    bases, questions, candidate = ctx.bases, ctx.questions, ctx.candidate
    base = bases[item]
    rel = data.draw(st.sampled_from(base.files), label="file")
    with base.copy() as (root, legs):
        path = root / rel
        what = structural(data.draw, path)
        if path.name != SEAL_FILE:
            seal_leg(root / base.leg_of(rel))
            what += " (resealed)"
        else:
            what += " (seal.json itself, not resealed)"
        what = f"{item.value}: {rel}: {what}"
        note(what)
        result = judged(item, questions[item], legs, candidate, what)
        assert isinstance(result, (VerdictCell, InputError))


@pytest.mark.parametrize("item", ITEMS, ids=lambda i: i.value)
@CI
@given(data=st.data())
def test_robustness_ci(item, data, ctx):
    robustness(item, data, ctx)


@pytest.mark.fuzz
@long_only
@pytest.mark.parametrize("item", ITEMS, ids=lambda i: i.value)
@long_for("receipts")
@given(data=st.data())
def test_robustness_long(item, data, ctx):
    counted("receipts")
    robustness(item, data, ctx)


# ---------------------------------------------------------------------------- named cases


def _first(base, name: str) -> str:
    return next(f for f in base.files if f.endswith("/" + name) or f == name)


def _edit_json(path: Path, fn) -> None:
    path.write_text(to_text(fn(json.loads(path.read_text()))))


NAMED_JSON = {
    "leg.json is a list": ("leg.json", lambda d: [d]),
    "leg.json is a string": ("leg.json", lambda d: "leg"),
    "leg.json is null": ("leg.json", lambda d: None),
    "leg.json item is a list": ("leg.json", lambda d: {**d, "item": [d["item"]]}),
    "leg.json arm is a dict": ("leg.json", lambda d: {**d, "arm": {"arm": d["arm"]}}),
    "leg.json started_at is 2**70": ("leg.json", lambda d: {**d, "started_at": 2**70}),
    "leg.json started_at is NaN": ("leg.json", lambda d: {**d, "started_at": Raw("NaN")}),
    "leg.json ended_at naive": ("leg.json", lambda d: {**d, "ended_at": "2026-11-29T10:05:00"}),
    "leg.json processes is a dict": ("leg.json", lambda d: {**d, "processes": {"a": 1}}),
    "leg.json processes holds a string": ("leg.json", lambda d: {**d, "processes": ["x"]}),
    "leg.json errors is a string": ("leg.json", lambda d: {**d, "errors": "boom"}),
    "leg.json errors is an int": ("leg.json", lambda d: {**d, "errors": 3}),
    "leg.json resolved_config is a list": ("leg.json", lambda d: {**d, "resolved_config": []}),
    "leg.json versions is a string": ("leg.json", lambda d: {**d, "versions": "torch"}),
    "leg.json env is a list": ("leg.json", lambda d: {**d, "env": ["VLLM_BATCH_INVARIANT=1"]}),
    "leg.json device is null": ("leg.json", lambda d: {**d, "device": None}),
    "leg.json source is a string": ("leg.json", lambda d: {**d, "source": "github.com/x"}),
    "leg.json 1000-deep list": ("leg.json", lambda d: {**d, "kernels": Raw(_deep(1000, "[", "]", ""))}),
    "leg.json 100000-deep list": ("leg.json", lambda d: {**d, "kernels": Raw(_deep(100_000, "[", "]", ""))}),
    "leg.json 10**5000 int": ("leg.json", lambda d: {**d, "round": Raw("1" + "0" * 5000)}),
    "leg.json 1e400": ("leg.json", lambda d: {**d, "round": Raw("1e400")}),
    "leg.json lone surrogate": ("leg.json", lambda d: {**d, "arm": Raw('"\\ud800"')}),
    # the two tracebacks of issue 32's 4,000 fuzzed receipts
    "leg.json not run without an arm": ("leg.json", lambda d: {**{k: v for k, v in d.items() if k != "arm"},
                                                                "not_run_reason": "vLLM refused the model"}),
    "bench.json duration 1e30": ("bench.json", lambda d: {**d, "duration": 1e30}),
}


def _cases():
    for item in ITEMS:
        for name in NAMED_JSON:
            yield pytest.param(item, name, id=f"{item.value}-{name}")


@pytest.mark.parametrize(("item", "name"), list(_cases()))
def test_named_structural(item, name, bases, questions, candidate):
    fname, fn = NAMED_JSON[name]
    base = bases[item]
    with base.copy() as (root, legs):
        for rel in [f for f in base.files if f.endswith("/" + fname)]:
            _edit_json(root / rel, fn)
            seal_leg(root / base.leg_of(rel))
        result = judged(item, questions[item], legs, candidate, name)
        assert isinstance(result, (VerdictCell, InputError))


SEAL_CASES = {
    "files is a list": lambda s: {**s, "files": list(s["files"])},
    "files is a string": lambda s: {**s, "files": "all"},
    "files is null": lambda s: {**s, "files": None},
    "files missing": lambda s: {k: v for k, v in s.items() if k != "files"},
    "seal is a list": lambda s: [s],
    "digests are ints": lambda s: {**s, "files": {k: 0 for k in s["files"]}},
    "digests are null": lambda s: {**s, "files": {k: None for k in s["files"]}},
    "digests are lists": lambda s: {**s, "files": {k: [v] for k, v in s["files"].items()}},
    "files names a path outside the leg": lambda s: {**s, "files": {**s["files"], "../../x": "0" * 64}},
    "files names an absolute path": lambda s: {**s, "files": {**s["files"], "/etc/hostname": "0" * 64}},
    "files names a directory": lambda s: {**s, "files": {**s["files"], ".": "0" * 64}},
    "files empty": lambda s: {**s, "files": {}},
    "files 1000-deep": lambda s: {**s, "files": Raw(_deep(1000, '{"a": ', "}"))},
}


@pytest.mark.parametrize("item", ITEMS, ids=lambda i: i.value)
@pytest.mark.parametrize("name", list(SEAL_CASES))
def test_broken_seal_never_passes(item, name, bases, questions, candidate):
    base = bases[item]
    with base.copy() as (root, legs):
        rel = _first(base, SEAL_FILE)
        _edit_json(root / rel, SEAL_CASES[name])
        result = judged(item, questions[item], legs, candidate, name)
        assert isinstance(result, (VerdictCell, InputError))
        _not_pass(result, f"{item.value}: {rel}: {name}")


NPZ_CASES = {
    "decode_mask (n,1)": ("decode_mask", lambda a: a.reshape(-1, 1)),
    "decode_mask int8": ("decode_mask", lambda a: a.astype(np.int8)),
    "decode_mask truncated": ("decode_mask", lambda a: a[:-1]),
    "token_ids (n,1)": ("token_ids", lambda a: a.reshape(-1, 1)),
    "seq_lens (n,1)": ("seq_lens", lambda a: a.reshape(-1, 1)),
    "seq_lens 0-d": ("seq_lens", lambda a: np.array(a.sum(), dtype=a.dtype)),
    "seq_lens negative": ("seq_lens", lambda a: np.array([-1, *a[1:]], dtype=a.dtype)),
    "seq_lens huge": ("seq_lens", lambda a: np.array([2**31 - 1, *a[1:]], dtype=a.dtype)),
    "seq_lens empty": ("seq_lens", lambda a: a[:0]),
    "trainer_logprobs truncated": ("trainer_logprobs", lambda a: a[:-1]),
    "trainer_logprobs (1,n)": ("trainer_logprobs", lambda a: a.reshape(1, -1)),
    "trainer_logprobs float64": ("trainer_logprobs", lambda a: a.astype(np.float64)),
    "trainer_logprobs NaN": ("trainer_logprobs", lambda a: np.full_like(a, np.nan)),
    "rollout_logprobs inf": ("rollout_logprobs", lambda a: np.full_like(a, np.inf)),
    "rollout_logprobs big-endian": ("rollout_logprobs", lambda a: a.astype(">f4")),
    "decode_logprobs (n,1)": ("decode_logprobs", lambda a: a.reshape(-1, 1)),
}


@pytest.mark.parametrize("item", [i for i in ITEMS if i.value in ("forward", "update", "artifacts")],
                         ids=lambda i: i.value)
@pytest.mark.parametrize("name", list(NPZ_CASES))
def test_named_npz(item, name, bases, questions, candidate):
    key, fn = NPZ_CASES[name]
    base = bases[item]
    with base.copy() as (root, legs):
        for rel in [f for f in base.files if f.endswith(".npz")]:
            p = root / rel
            with np.load(p, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            arrays[key] = fn(arrays[key])
            np.savez(p.with_suffix(""), **arrays)  # savez appends .npz
        for leg in legs:
            seal_leg(leg)
        result = judged(item, questions[item], legs, candidate, name)
        assert isinstance(result, (VerdictCell, InputError))


# ---------------------------------------------------------------------------- FIFOs


# The receipt files each item's passing set holds (tica.canaries.BUILDERS).
FIFO_FILES = {
    "forward": ["metrics.jsonl", "step_0001.npz", "leg.json"],
    "backward": ["metrics.jsonl", "leg.json"],
    "update": ["metrics.jsonl", "step_0001.npz", "leg.json"],
    "quality": ["results.jsonl", "contract.json", "leg.json"],
    "throughput": ["bench.json", "leg.json"],
    "clean_exit": ["leg.json"],
    "artifacts": ["metrics.jsonl", "step_0001.npz", "leg.json"],
}


def _fifo_cases():
    for item in ITEMS:
        for name in FIFO_FILES[item.value]:
            for reseal in (False, True):
                yield pytest.param(item, name, reseal, id=f"{item.value}-{name}-{'resealed' if reseal else 'unsealed'}")


@pytest.mark.parametrize(("item", "name", "reseal"), list(_fifo_cases()))
def test_fifo_never_hangs(item, name, reseal, ctx):
    """A named pipe in place of a receipt: a clear error or a non-pass verdict, never a hang."""
    bases, questions, candidate = ctx.bases, ctx.questions, ctx.candidate
    base = bases[item]
    rels = [f for f in base.files if f.endswith("/" + name)]
    assert rels, f"no {name} in {item.value}'s passing set"
    with base.copy() as (root, legs):
        rel = rels[0]
        (root / rel).unlink()
        os.mkfifo(root / rel)
        if reseal:
            seal_leg(root / base.leg_of(rel))  # a seal that skips the pipe (not a regular file)
        what = f"{item.value}: {rel}: FIFO{' (resealed)' if reseal else ''}"
        result = judged(item, questions[item], legs, candidate, what)
        assert isinstance(result, (VerdictCell, InputError))
        _not_pass(result, what)
