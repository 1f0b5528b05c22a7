"""Errors for bad input: each names the file and the field a user must fix, and the line where
the file holds that field when it can be told for sure."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

EXIT_BAD_INPUT = 4


class UsageParser(argparse.ArgumentParser):
    """Usage errors exit 4 (bad input), like every other bad input: exit 2 means inconclusive."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


class TicaError(Exception):
    """Base of every error TICA raises on purpose."""


class InputError(TicaError):
    """Bad input: malformed file, missing file, unknown or contradictory field. `line` (1-based)
    is where the file holds the field; None when it is not known for sure."""

    def __init__(self, file: str | Path, field: str, message: str, line: int | None = None) -> None:
        self.file = str(file)
        self.field = field
        self.message = message
        self.line = line
        # The line goes last: "FILE: FIELD: message" stays what callers and scripts match on.
        super().__init__(f"{self.file}: {field}: {message}" + ("" if line is None else f" (line {line})"))


class ManifestError(InputError):
    """A candidate manifest that cannot be read or validated."""


class QuestionError(InputError):
    """A question file that cannot be read, validated, or that contradicts itself."""


class ReceiptError(InputError):
    """A receipt that is missing, malformed, or whose seal does not match."""


class FrozenQuestionError(TicaError):
    """An attempt to change a question that is already frozen."""


class LedgerIntegrityError(TicaError):
    """The ledger's hash chain does not verify."""


def _strict_yaml_loader():
    """PyYAML's SafeLoader, refusing a key that appears twice in one mapping (never last-wins)."""
    import yaml
    from yaml.constructor import ConstructorError

    class StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, (list, dict)):
                    raise ConstructorError(None, None, "a mapping key must be a plain value", key_node.start_mark)
                if key in seen:
                    raise ConstructorError(None, None, f"duplicate key {key!r}: a key may appear once",
                                           key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


@contextmanager
def _file_named(path: str | Path, exc_cls: type[InputError]) -> Iterator[None]:
    """A missing, unreadable or refused input file raised as `exc_cls` naming it (exit 4)."""
    from tica import strict_io

    try:
        yield
    except FileNotFoundError:
        raise exc_cls(path, "<file>", "no such file") from None
    except OSError as err:
        raise exc_cls(path, "<file>", f"cannot read: {err.strerror}") from None
    except strict_io.StrictInputError as err:
        raise exc_cls(path, "<file>", str(err)) from None


def input_bytes(path: str | Path, exc_cls: type[InputError] = InputError, max_bytes: int | None = None) -> bytes:
    """A regular file's bytes (tica.strict_io), at most `max_bytes` where given; failures name the
    file (exit 4)."""
    from tica import strict_io

    with _file_named(path, exc_cls):
        if max_bytes is not None and os.stat(path).st_size > max_bytes:
            raise exc_cls(path, "<file>", f"larger than {max_bytes} bytes")
        return strict_io.regular_file_bytes(path)


def input_lines(path: str | Path, exc_cls: type[InputError] = InputError) -> Iterator[tuple[int, str]]:
    """A regular file's lines, streamed and numbered (tica.strict_io.regular_file_lines); failures
    name the file (exit 4)."""
    from tica import strict_io

    with _file_named(path, exc_cls):
        yield from strict_io.regular_file_lines(path)


def input_text(path: str | Path, exc_cls: type[InputError] = InputError, max_bytes: int | None = None) -> str:
    """A regular file's UTF-8 text; failures name the file (exit 4)."""
    from tica import strict_io

    try:
        return strict_io.text_of(input_bytes(path, exc_cls, max_bytes))
    except strict_io.StrictInputError as err:
        raise exc_cls(path, "<file>", str(err)) from None


def read_yaml_mapping(path: str | Path, exc_cls: type[InputError]) -> tuple[bytes, dict]:
    """A YAML file's bytes and its top-level mapping; failures name the file and what broke.
    Only a regular file is read; duplicate keys and nesting past strict_io.MAX_DEPTH are refused."""
    raw = read_file_bytes(path, exc_cls)
    return raw, yaml_mapping_of(raw, path, exc_cls)


def read_file_bytes(path: str | Path, exc_cls: type[InputError]) -> bytes:
    """A regular file's bytes; failures name the file."""
    from tica import strict_io

    try:
        return strict_io.regular_file_bytes(path)
    except OSError as err:
        raise exc_cls(path, "<file>", f"cannot read: {err.strerror}") from None
    except strict_io.StrictInputError as err:
        raise exc_cls(path, "<file>", str(err)) from None


YAML_MAX_VALUES = 1_000_000  # a manifest or question holds hundreds


def yaml_mapping_of(raw: bytes, path: str | Path, exc_cls: type[InputError]) -> dict:
    """The top-level mapping of YAML bytes read from `path` (named in every failure)."""
    import yaml

    from tica import strict_io

    try:
        data = yaml.load(strict_io.text_of(raw), Loader=_strict_yaml_loader())  # noqa: S506 - a SafeLoader
        strict_io.depth(data, max_values=YAML_MAX_VALUES)
    except strict_io.StrictInputError as err:
        raise exc_cls(path, "<file>", str(err)) from None
    except yaml.YAMLError as err:
        raise exc_cls(path, "<yaml>", f"malformed YAML: {err}") from None
    except RecursionError:
        raise exc_cls(path, "<yaml>", "nested deeper than the parser can follow") from None
    except ValueError as err:  # e.g. an integer past Python's digit limit
        raise exc_cls(path, "<yaml>", f"unreadable value: {err}") from None
    if not isinstance(data, dict):
        raise exc_cls(path, "<root>", "must be a mapping of fields")
    return data


def pydantic_errors(exc_cls: type[InputError], file: str | Path, err: Exception) -> InputError:
    """Turn a pydantic ValidationError into one InputError naming the first bad field, and its
    line in `file` when the file can be shown to hold the refused value there (field_line)."""
    errors = getattr(err, "errors", None)
    if callable(errors):
        items = errors()
        if items:
            first = items[0]
            loc = tuple(first.get("loc", ()))
            field = ".".join(str(p) for p in loc) or "<root>"
            more = f" (and {len(items) - 1} more)" if len(items) > 1 else ""
            line = None
            if "input" in first:
                line = field_line(file, loc, first["input"], missing=first.get("type") == "missing")
            return exc_cls(file, field, f"{first.get('msg', 'invalid')}{more}", line=line)
    return exc_cls(file, "<root>", str(err))


# ---------------------------------------------------------------- the line of a refused field


def field_line(file: str | Path, loc: tuple[Any, ...], refused: Any, missing: bool = False) -> int | None:
    """The 1-based line where `file` (YAML or JSON) holds the field at pydantic location `loc`:
    the line of its key (of its item, in a list); for a missing field, the line of the mapping
    that lacks it. `refused` is the value pydantic refused there (its error's `input`): a line
    is named only when the file, read again, holds that very value at that place, so a file
    changed since, or data that never came from this file, names no line rather than a wrong
    one. None as well for the root, a JSON Lines file (its row is its line) and anything
    unreadable. Union tags in `loc` (a discriminator value, a type name) are not in the file
    and are stepped over."""
    try:
        path = Path(file)
        if path.suffix == ".jsonl" or not path.is_file():
            return None
        found = _locate(path, loc[:-1] if missing else loc)
    except Exception:  # noqa: BLE001 - the line is a courtesy on an error already raised: never a new failure
        return None
    if found is None:
        return None
    line, value = found
    if missing and not (isinstance(value, dict) and loc and loc[-1] not in value):
        return None
    return line if _same(value, refused) else None


def _locate(path: Path, loc: tuple[Any, ...]) -> tuple[int | None, Any] | None:
    """(line, value) at `loc` in the file at `path`, read as JSON if it is JSON, else as YAML."""
    from tica import strict_io

    text = strict_io.text_of(strict_io.regular_file_bytes(path))
    try:
        data, root, members = strict_io.loads(text), 0, lambda at: strict_io.json_members(text, at)
    except strict_io.StrictInputError:
        import yaml

        data = yaml.load(text, Loader=_strict_yaml_loader())  # noqa: S506 - a SafeLoader
        root, members = yaml.compose(text, Loader=yaml.SafeLoader), _yaml_members
    return _walk(data, root, loc, members)


def _yaml_members(node: Any) -> list[tuple[int, Any]] | None:
    """(1-based line of the key or item, value node) of a YAML mapping or sequence node."""
    import yaml

    # (a `<<: *base` merge key, which would take keys written elsewhere, never gets here: the
    # strict loader refuses it before anything is validated)
    if isinstance(node, yaml.MappingNode):
        return [(k.start_mark.line + 1, v) for k, v in node.value]
    if isinstance(node, yaml.SequenceNode):
        return [(v.start_mark.line + 1, v) for v in node.value]
    return None


def _walk(data: Any, root: Any, loc: tuple[Any, ...], members) -> tuple[int | None, Any] | None:
    """Follow `loc` through the loaded value and, in step, through the file's members (both in
    file order: a mapping's i-th key is the file's i-th key, duplicates being refused)."""
    node, value, line = root, data, None
    for part in loc:
        if isinstance(value, dict) and part in value:
            index = list(value).index(part)
        elif isinstance(value, list) and type(part) is int and 0 <= part < len(value):
            index = part
        elif isinstance(part, str):
            continue  # a union tag: pydantic's name for the member it tried, not a key of the file
        else:
            return None
        listed = members(node)
        if listed is None or len(listed) != len(value):
            return None
        line, node = listed[index]
        value = value[part] if isinstance(value, dict) else value[index]
    return line, value


def _same(a: Any, b: Any) -> bool:
    """Equal, type for type (True is not 1), NaN equal to NaN: the refused value is the file's."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and a != a:
        return b != b
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b
