"""Errors for bad input: each names the file and the field a user must fix."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_BAD_INPUT = 4


class UsageParser(argparse.ArgumentParser):
    """Usage errors exit 4 (bad input), like every other bad input: exit 2 means inconclusive."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


class TicaError(Exception):
    """Base of every error TICA raises on purpose."""


class InputError(TicaError):
    """Bad input: malformed file, missing file, unknown or contradictory field."""

    def __init__(self, file: str | Path, field: str, message: str) -> None:
        self.file = str(file)
        self.field = field
        self.message = message
        super().__init__(f"{self.file}: {field}: {message}")


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


def read_yaml_mapping(path: str | Path, exc_cls: type[InputError]) -> tuple[bytes, dict]:
    """A YAML file's bytes and its top-level mapping; failures name the file and what broke.
    Only a regular file is read; duplicate keys and nesting past strict_io.MAX_DEPTH are refused."""
    import yaml

    from tica import strict_io

    try:
        raw = strict_io.regular_file_bytes(path)
        data = yaml.load(strict_io.text_of(raw), Loader=_strict_yaml_loader())  # noqa: S506 - a SafeLoader
        strict_io.depth(data)
    except OSError as err:
        raise exc_cls(path, "<file>", f"cannot read: {err.strerror}") from None
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
    return raw, data


def pydantic_errors(exc_cls: type[InputError], file: str | Path, err: Exception) -> InputError:
    """Turn a pydantic ValidationError into one InputError naming the first bad field."""
    errors = getattr(err, "errors", None)
    if callable(errors):
        items = errors()
        if items:
            first = items[0]
            field = ".".join(str(p) for p in first.get("loc", ())) or "<root>"
            more = f" (and {len(items) - 1} more)" if len(items) > 1 else ""
            return exc_cls(file, field, f"{first.get('msg', 'invalid')}{more}")
    return exc_cls(file, "<root>", str(err))
