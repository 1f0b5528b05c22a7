"""Manifests and questions under fuzz (issue 11): a file written from a valid base, mutated, either
loads or raises the clear error (ManifestError / QuestionError), never another exception; a
question whose numbers are NaN or infinite never loads (a NaN budget can never fail). What loads
is then used to judge a passing set: a verdict or an InputError, never a traceback."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, note
from hypothesis import strategies as st

from tica.errors import InputError, ManifestError, QuestionError
from tica.judges import load_candidate
from tica.manifest import load_manifest
from tica.question import load_question

from .conftest import CI, H200_SHAPED, ITEMS, _deep, counted, judged, long_for, long_only, mutate_bytes, no_hang, \
    node_paths, write_manifest_text

pytestmark = pytest.mark.filterwarnings("ignore")

SENTINEL = "__FUZZ_SENTINEL__"

WEIRD_YAML: list[str] = [
    "[]", "{}", '"x"', "''", str(2**70), str(-(2**70)), str(2**64), ".nan", ".NaN", ".inf", "-.inf", "+.inf",
    "1.0e+400", "-1.0e+400", "!!float nan", "!!float inf", "null", "~", "true", "yes", "no", "on", "0", "-1", "0x1F",
    "0o17", "1_000", "1:30", "2026-01-01", "2026-01-01T10:00:00Z", "!!binary aGVsbG8=", "!!set {a, b}",
    "!!omap [a: 1]", "!!python/object/apply:os.getcwd []", "!!python/name:os.system", "&x [*x]", '"\\ud800"',
    '"\\0"', '"\\x80"', _deep(1000, "[", "]", ""), _deep(1000, "{a: ", "}"), _deep(100_000, "[", "]", ""),
    "1" + "0" * 5000, "-" + "9" * 5000, "1." + "0" * 5000 + "1", "[.nan, .inf]", "{.nan: 1}", "{[a]: 1}",
    "{1: 2}", "!!int '12'", "!!str 12", "[1, [2, [3]]]", "'  '", '"' + "x" * 100_000 + '"', "!unknown x",
    "*undefined_alias",
]

yaml_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                      st.text(max_size=20))
yaml_values = st.recursive(yaml_leaf, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                            st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                           max_leaves=10)


def _alias_bomb(levels: int = 9, fan: int = 10) -> str:
    text = "&a0 [" + ", ".join(['"lol"'] * fan) + "]"
    for i in range(1, levels + 1):
        text = f"[{text}, &a{i} [" + ", ".join([f"*a{i - 1}"] * fan) + "]]"
    return text


def _flow(v: Any) -> str:
    """A Python value as one line of YAML flow text."""
    return yaml.safe_dump(v, default_flow_style=True, width=10**9, allow_unicode=False).strip().removesuffix("...").strip()


class Y(str):
    """YAML text with a short repr (hypothesis prints every draw)."""

    def __repr__(self) -> str:
        t = str(self)
        return repr(t) if len(t) <= 60 else f"{t[:40]!r}...(len={len(t)})"


weird_yaml = st.one_of(st.sampled_from(WEIRD_YAML), yaml_values.map(_flow)).map(Y)


def _get(node: Any, path: tuple) -> Any:
    for p in path:
        node = node[p]
    return node


def mutate_yaml(draw, data: dict) -> tuple[bytes, str]:
    """A valid mapping, mutated, as YAML bytes."""
    import copy

    data = copy.deepcopy(data)
    kind = draw(st.sampled_from(["value"] * 5 + ["delete", "add", "dup_top", "dup_nested", "bytes"]), label="kind")
    if kind == "bytes":
        raw, what = mutate_bytes(draw, yaml.safe_dump(data, sort_keys=False).encode())
        return raw, what
    paths = [p for p in node_paths(data) if p]
    if kind == "value":
        path = draw(st.sampled_from(paths), label="path")
        w = draw(weird_yaml, label="value")
        _get(data, path[:-1])[path[-1]] = SENTINEL
        text = yaml.safe_dump(data, sort_keys=False, width=10**9).replace(SENTINEL, w, 1)
        return text.encode(), f"{'/'.join(map(str, path))} := {w[:60]!r}"
    dict_paths = [p for p in paths if isinstance(_get(data, p[:-1]), dict)]
    if kind == "delete":
        path = draw(st.sampled_from(dict_paths), label="path")
        del _get(data, path[:-1])[path[-1]]
        return yaml.safe_dump(data, sort_keys=False).encode(), f"del {'/'.join(map(str, path))}"
    if kind == "add":
        parents = [()] + [p for p in paths if isinstance(_get(data, p), dict)]
        parent = draw(st.sampled_from(parents), label="parent")
        key = draw(st.one_of(st.sampled_from(["extra", "item", "criteria", "track", "budget"]), st.text(max_size=6)))
        w = draw(weird_yaml, label="value")
        _get(data, parent)[key] = SENTINEL
        text = yaml.safe_dump(data, sort_keys=False, width=10**9).replace(SENTINEL, w, 1)
        return text.encode(), f"{'/'.join(map(str, parent)) or '<root>'}: add {key!r} = {w[:60]!r}"
    if kind == "dup_top":
        key = draw(st.sampled_from(sorted(data)), label="key")
        w = draw(weird_yaml, label="value")
        text = yaml.safe_dump(data, sort_keys=False, width=10**9)
        first = draw(st.booleans(), label="dup first?")
        line = f"{json.dumps(key)}: {w}\n"
        text = line + text if first else text + line
        return text.encode(), f"duplicate top-level key {key!r} = {w[:60]!r} ({'first' if first else 'last'})"
    # a nested mapping written in flow style with one key twice
    parents = [p for p in paths if isinstance(_get(data, p), dict) and _get(data, p)]
    if not parents:
        return yaml.safe_dump(data).encode(), "unchanged"
    parent = draw(st.sampled_from(parents), label="parent")
    node = _get(data, parent)
    key = draw(st.sampled_from(sorted(node)), label="key")
    w = draw(weird_yaml, label="value")
    pairs = [f"{json.dumps(str(k))}: {_flow(v)}" for k, v in node.items()]
    pairs.append(f"{json.dumps(str(key))}: {w}")
    _get(data, parent[:-1])[parent[-1]] = SENTINEL
    text = yaml.safe_dump(data, sort_keys=False, width=10**9).replace(SENTINEL, "{" + ", ".join(pairs) + "}", 1)
    return text.encode(), f"{'/'.join(map(str, parent))}: duplicate key {key!r} = {w[:60]!r}"


def _nonfinite(node: Any) -> list[str]:
    if isinstance(node, float):
        return [repr(node)] if not math.isfinite(node) else []
    if isinstance(node, dict):
        return [x for v in node.values() for x in _nonfinite(v)]
    if isinstance(node, (list, tuple)):
        return [x for v in node for x in _nonfinite(v)]
    return []


_count = itertools.count()


# ---------------------------------------------------------------------------- manifests


def manifest_property(data, ctx, tmp_path: Path) -> None:
    raw, what = mutate_yaml(data.draw, H200_SHAPED)
    note(f"manifest: {what}")
    folder = tmp_path / f"m{next(_count)}"
    path = write_manifest_text(folder, raw)
    with no_hang(what=what):
        try:
            loaded = load_manifest(path)
        except ManifestError:
            return
    # It loaded: identify it and judge a passing set for it (a verdict or a clear error).
    if loaded.checkpoint_path is not None and not loaded.checkpoint_path.is_relative_to(folder.resolve()):
        return  # a checkpoint elsewhere on this machine: hashing it is not this test's business
    with no_hang(what=what):
        try:
            cand = load_candidate(path)
        except InputError:
            return
    item = data.draw(st.sampled_from(ITEMS), label="judged item")
    base = ctx.bases[item]
    judged(item, ctx.questions[item], [base.root / r for r in base.rel_legs], cand, what)


@CI
@given(data=st.data())
def test_manifest_ci(data, ctx, tmp_path):
    manifest_property(data, ctx, tmp_path)


@pytest.mark.fuzz
@long_only
@long_for("manifests")
@given(data=st.data())
def test_manifest_long(data, ctx, tmp_path):
    counted("manifests")
    manifest_property(data, ctx, tmp_path)


# ---------------------------------------------------------------------------- questions


def question_property(item, data, ctx, tmp_path: Path) -> None:
    base = ctx.questions[item].model_dump(mode="json")
    raw, what = mutate_yaml(data.draw, base)
    note(f"question {item.value}: {what}")
    path = tmp_path / f"q{next(_count)}.yaml"
    path.write_bytes(raw)
    with no_hang(what=what):
        try:
            q = load_question(path)
        except QuestionError:
            return
    bad = _nonfinite(q.model_dump())
    assert not bad, f"a question with non-finite numbers loaded ({what}): {bad}"
    legs = ctx.bases[q.item]
    judged(q.item, q, [legs.root / r for r in legs.rel_legs], ctx.candidate, what)


@pytest.mark.parametrize("item", ITEMS, ids=lambda i: i.value)
@CI
@given(data=st.data())
def test_question_ci(item, data, ctx, tmp_path):
    question_property(item, data, ctx, tmp_path)


@pytest.mark.fuzz
@long_only
@pytest.mark.parametrize("item", ITEMS, ids=lambda i: i.value)
@long_for("questions")
@given(data=st.data())
def test_question_long(item, data, ctx, tmp_path):
    counted("questions")
    question_property(item, data, ctx, tmp_path)


# ---------------------------------------------------------------------------- named cases


def test_unmutated_bases_load(ctx, tmp_path):
    """The negative control: the unmutated manifest and questions load, and are the same."""
    load_manifest(write_manifest_text(tmp_path / "m", yaml.safe_dump(H200_SHAPED, sort_keys=False)))
    for item, q in ctx.questions.items():
        p = tmp_path / f"{item.value}.yaml"
        p.write_text(yaml.safe_dump(q.model_dump(mode="json"), sort_keys=False))
        assert load_question(p) == q


def _numeric_paths():
    from tica.canaries import default_questions

    for item, q in default_questions().items():
        data = q.model_dump(mode="json")
        for path in node_paths(data):
            v = _get(data, path)
            if path and isinstance(v, (int, float)) and not isinstance(v, bool):
                for bad in (".nan", ".inf", "-.inf"):
                    yield pytest.param(item, path, bad, id=f"{item.value}-{'/'.join(map(str, path))}-{bad}")


@pytest.mark.parametrize(("item", "path", "bad"), list(_numeric_paths()))
def test_question_with_nonfinite_number_never_loads(item, path, bad, ctx, tmp_path):
    data = ctx.questions[item].model_dump(mode="json")
    _get(data, path[:-1])[path[-1]] = SENTINEL
    p = tmp_path / "q.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False).replace(SENTINEL, bad, 1))
    with pytest.raises(QuestionError):
        load_question(p)


NAMED_YAML = {
    "deep list 1000": lambda t: t.replace("track: fuzz", "track: " + _deep(1000, "[", "]", "")),
    "deep list 100000": lambda t: t.replace("track: fuzz", "track: " + _deep(100_000, "[", "]", "")),
    "deep map 1000": lambda t: t.replace("track: fuzz", "track: " + _deep(1000, "{a: ", "}")),
    "alias cycle": lambda t: t.replace("track: fuzz", "track: &x [*x]"),
    # a billion values from 1 KB of text: nine anchors, each a list of ten aliases of the one before
    "alias bomb": lambda t: t.replace("track: fuzz", "track: " + _alias_bomb()),
    "huge int nodes": lambda t: t.replace("nodes: 1", "nodes: 1" + "0" * 5000),
    "huge int tp": lambda t: t.replace("tp: 1", "tp: " + str(2**70)),
    "huge int input_len": lambda t: t.replace("input_len: 8192", "input_len: " + str(2**70)),
    "huge float length_cap": lambda t: t.replace("length_cap: 256", "length_cap: 1.0e+400"),
    "nan temperature": lambda t: t.replace("temperature: 0.0", "temperature: .nan"),
    "inf temperature": lambda t: t.replace("temperature: 0.0", "temperature: .inf"),
    "duplicate track": lambda t: t + "track: other\n",
    "python tag": lambda t: t.replace("track: fuzz", "track: !!python/object/apply:os.getcwd []"),
    "binary value": lambda t: t.replace("track: fuzz", "track: !!binary aGVsbG8="),
    "date commit": lambda t: t.replace("commit: 0123456789abcdef", "commit: 2026-01-01"),
    "int commit": lambda t: t.replace("commit: 0123456789abcdef", "commit: 123456789"),
    "list key": lambda t: t.replace("track: fuzz", "track: {[a]: 1}"),
    "non-UTF-8": lambda t: t.replace("track: fuzz", "track: fu\udcffzz"),
    "lone surrogate escape": lambda t: t.replace("track: fuzz", 'track: "\\ud800"'),
    "NUL byte": lambda t: t.replace("track: fuzz", "track: fu\x00zz"),
    "document list": lambda t: "- " + t.replace("\n", "\n  "),
    "two documents": lambda t: t + "---\n" + t,
    "empty": lambda t: "",
    "only a comment": lambda t: "# nothing\n",
    "BOM": lambda t: "\ufeff" + t,
    "checkpoint path is a list": lambda t: t.replace("path: ckpt", "path: [ckpt]"),
    "concurrencies nan": lambda t: t.replace("- 64", "- .nan", 1),
}


@pytest.mark.parametrize("name", list(NAMED_YAML))
def test_named_manifest(name, tmp_path):
    text = NAMED_YAML[name](yaml.safe_dump(H200_SHAPED, sort_keys=False, width=10**9))
    path = write_manifest_text(tmp_path, text.encode("utf-8", "surrogateescape"))
    with no_hang(what=name):
        try:
            load_manifest(path)
        except ManifestError:
            pass


def test_an_alias_bomb_is_refused_by_what_it_expands_to(tmp_path):
    """Issue 32: the bomb hung past 60 s. Refused when its expansion passes a million values;
    the control, a manifest using one anchor as people do, still loads."""
    text = yaml.safe_dump(H200_SHAPED, sort_keys=False, width=10**9)
    with no_hang(what="alias bomb"), pytest.raises(ManifestError, match="aliases are expanded"):
        load_manifest(write_manifest_text(tmp_path / "bomb", NAMED_YAML["alias bomb"](text).encode()))
    anchored = text.replace("description: ", "description: &d ", 1).replace("reference: ", "reference: *d #", 1)
    assert "*d" in anchored
    assert load_manifest(write_manifest_text(tmp_path / "ok", anchored.encode())).manifest.image.reference == "test candidate"


@pytest.mark.parametrize("name", ["huge int", "deep list 100000", "alias cycle", "duplicate item", "python tag"])
@pytest.mark.parametrize("item", ITEMS, ids=lambda i: i.value)
def test_named_question(item, name, ctx, tmp_path):
    text = yaml.safe_dump(ctx.questions[item].model_dump(mode="json"), sort_keys=False, width=10**9)
    text = {"huge int": lambda t: t.replace("noise_floor: 0.0", "noise_floor: 1" + "0" * 5000),
            "deep list 100000": lambda t: t.replace("noise_floor: 0.0", "noise_floor: " + _deep(100_000, "[", "]", "")),
            "alias cycle": lambda t: t.replace("noise_floor: 0.0", "noise_floor: &x [*x]"),
            "duplicate item": lambda t: t + "item: forward\n",
            "python tag": lambda t: t.replace("noise_floor: 0.0", "noise_floor: !!python/object/apply:os.getcwd []"),
            }[name](text)
    p = tmp_path / "q.yaml"
    p.write_text(text)
    with no_hang(what=name):
        try:
            load_question(p)
        except QuestionError:
            pass
