"""Reading input files strictly: only regular files, UTF-8, no duplicate keys, bounded nesting.

A duplicate key is refused, never last-wins (a leg.json listing a force-killed process and then
a clean one must not read as clean); a FIFO or device is refused before it is opened (it would
hang the reader); nesting deeper than MAX_DEPTH is refused rather than crashing the parser.
Standard library only: producers and judges both read through here. Errors are ValueError
with a message naming what is wrong; callers wrap them in their InputError with the file.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MAX_DEPTH = 64
MAX_BYTES = 256 * 1024 * 1024
# lines of one JSON Lines receipt or run file (steps, problems, metric rows): a million is far past
# any run, and counting them costs a fraction of a second where parsing ten million took minutes
MAX_LINES = 1_000_000


class StrictInputError(ValueError):
    """What is wrong with an input file's bytes (the caller names the file)."""


def regular_file_bytes(path: str | Path) -> bytes:
    """The bytes of a regular file; anything else (FIFO, device, directory, missing) is refused
    without opening it. OSError for a file that cannot be read."""
    st = os.stat(path)  # follows a symlink: what counts is what it points at
    if not stat.S_ISREG(st.st_mode):
        raise StrictInputError("not a regular file (a FIFO, device or directory is never read)")
    if st.st_size > MAX_BYTES:
        raise StrictInputError(f"{st.st_size} bytes: larger than the {MAX_BYTES} a receipt file may hold")
    with open(path, "rb") as f:
        return f.read()


def regular_file_lines(path: str | Path, max_line: int = MAX_BYTES) -> Iterator[tuple[int, str]]:
    """A regular file's lines, streamed (numbered from 1, without their newline): a file of any
    size in memory of one line; a line over `max_line` bytes or not UTF-8 is refused naming its
    number. Anything but a regular file is refused before it is opened; OSError as for
    regular_file_bytes."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise StrictInputError("not a regular file (a FIFO, device or directory is never read)")
    with open(path, "rb") as f:
        n = 0
        while raw := f.readline(max_line + 2):
            n += 1
            body = raw[:-1] if raw.endswith(b"\n") else raw
            if len(body) > max_line:
                raise StrictInputError(f"line {n}: longer than the {max_line} bytes one line may hold")
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as err:
                raise StrictInputError(f"line {n}: not UTF-8 text (byte {err.start})") from None
            yield n, text


def text_of(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise StrictInputError(f"not UTF-8 text (byte {err.start})") from None


def lines_of(text: str, limit: int = MAX_LINES) -> list[str]:
    """The lines of a JSON Lines text, refused before any is parsed when there are more than `limit`."""
    n = text.count("\n")
    if n > limit:
        raise StrictInputError(f"{n} lines: more than the {limit} one file of rows may hold")
    return text.splitlines()


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise StrictInputError(f"duplicate key {key!r}: a key may appear once")
        out[key] = value
    return out


def depth(value: Any, limit: int = MAX_DEPTH, max_values: int | None = None) -> int:
    """Nesting depth of parsed JSON/YAML, stopping (and raising) past `limit`, or past
    `max_values` values counted as a reader walks them (YAML aliases repeat a node without
    repeating its text: nine nested anchors of ten aliases each are a billion values)."""
    stack = [(value, 1)]
    deepest = 0
    seen = 0
    while stack:
        node, d = stack.pop()
        seen += 1
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            children = ()
        if d > deepest:
            deepest = d
        # a container's scalars are counted and measured here, without a trip through the stack
        nested = [v for v in children if isinstance(v, (dict, list))]
        scalars = len(children) - len(nested)
        if scalars and d + 1 > deepest:
            deepest = d + 1
        seen += scalars
        if deepest > limit:
            raise StrictInputError(f"nested deeper than {limit} levels")
        if max_values is not None and seen > max_values:
            raise StrictInputError(f"holds more than {max_values} values once its aliases are expanded")
        stack += [(v, d + 1) for v in nested]
    return deepest


def loads(text: str) -> Any:
    """JSON with duplicate keys refused and nesting bounded (NaN/Infinity are left to the
    models, which say where a number must be finite)."""
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates)
    except RecursionError:
        raise StrictInputError(f"nested deeper than the parser can follow (limit {MAX_DEPTH})") from None
    except ValueError as err:  # malformed JSON, or an integer past Python's digit limit
        raise StrictInputError(f"malformed JSON: {err}") from None
    depth(value)
    return value


def read_json(path: str | Path) -> Any:
    return loads(text_of(regular_file_bytes(path)))


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\n\r":
        i += 1
    return i


def json_members(text: str, pos: int) -> list[tuple[int, int]] | None:
    """Where the members of the JSON value starting at `pos` are: for an object, each member's
    (1-based line of its key, offset of its value); for an array, each item's (line, offset); in
    file order. None: the value there is not an object or array. ValueError on malformed JSON.
    Only the members themselves are decoded (to skip them): enough to follow one field's path."""
    decoder = json.JSONDecoder()
    i = _skip_space(text, pos)
    if i >= len(text) or text[i] not in "{[":
        return None
    close = "}" if text[i] == "{" else "]"
    members: list[tuple[int, int]] = []
    line, counted = 1, 0
    i = _skip_space(text, i + 1)
    if text[i:i + 1] == close:
        return members
    while True:
        line, counted = line + text.count("\n", counted, i), i
        if close == "}":
            if text[i:i + 1] != '"':
                raise ValueError(f"expected a key at offset {i}")
            _, i = json.decoder.scanstring(text, i + 1)
            i = _skip_space(text, i)
            if text[i:i + 1] != ":":
                raise ValueError(f"expected ':' at offset {i}")
            i = _skip_space(text, i + 1)
        members.append((line, i))
        _, i = decoder.raw_decode(text, i)
        i = _skip_space(text, i)
        if text[i:i + 1] == close:
            return members
        if text[i:i + 1] != ",":
            raise ValueError(f"expected ',' or {close!r} at offset {i}")
        i = _skip_space(text, i + 1)
