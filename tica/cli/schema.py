"""`tica schema`: the JSON Schema of each file TICA validates, exported from its pydantic model.

    tica schema NAME        print the schema of NAME (e.g. leg, manifest, question)
    tica schema --list      the names, each with the file it validates
    tica schema --out DIR   write every schema as DIR/NAME.schema.json (or only NAME's, given NAME)

docs/schemas/ holds them, written by `tica schema --out docs/schemas`. Exit code: 0 done; 4 bad
input (an unknown NAME, a DIR that cannot be written). `tica.cli` wires `add_parser` and `run`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tica.cli._common import BAD, DONE, Help, Verb
from tica.errors import EXIT_BAD_INPUT, InputError, UsageParser

CLI = "<command line>"

HELP: dict[Verb, Help] = {
    ("schema",): Help((DONE, BAD), examples=("tica schema --list", "tica schema manifest",
                                              "tica schema --out docs/schemas")),
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `schema` to a `tica` subparsers object."""
    p = subparsers.add_parser("schema", help="print (or --out DIR) the JSON Schema of a file TICA validates",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", metavar="NAME", help="a schema name (see --list)")
    p.add_argument("--list", action="store_true", help="list the schema names and the file each validates")
    p.add_argument("--out", metavar="DIR", help="write DIR/NAME.schema.json for every schema (or NAME's only)")
    p.set_defaults(func=run)
    return p


def _write(folder: Path, names: list[str]) -> list[Path]:
    from tica import schemas

    try:
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for name in names:
            path = folder / schemas.file_name(name)
            path.write_text(schemas.schema_text(name), encoding="utf-8")
            written.append(path)
    except OSError as err:
        raise InputError(folder, "--out", f"cannot write: {err.strerror}") from None
    return written


def run(args: argparse.Namespace, out=None) -> int:
    """Run `tica schema` from parsed arguments; the exit code."""
    from tica import schemas

    out = out or sys.stdout
    try:
        if args.list and (args.name or args.out):
            raise InputError(CLI, "--list", "lists the names: give it alone")
        if args.list:
            width = max(map(len, schemas.names()))
            for name in schemas.names():
                e = schemas.entry(name)
                print(f"{name:<{width}}  {e.file}: {e.about}", file=out)
            return 0
        if args.name is not None and args.name not in schemas.REGISTRY:
            raise InputError(CLI, "NAME", f"unknown schema {args.name!r}: known are {', '.join(schemas.names())} "
                                          "(tica schema --list)")
        if args.out:
            for path in _write(Path(args.out), [args.name] if args.name else schemas.names()):
                print(path, file=out)
            return 0
        if args.name is None:
            raise InputError(CLI, "NAME", "give a schema name, --list or --out DIR")
        out.write(schemas.schema_text(args.name))
        return 0
    except InputError as err:
        print(f"tica: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT


def build_parser() -> argparse.ArgumentParser:
    """A parser holding only `schema`, for `python -m tica.cli.schema`."""
    parser = UsageParser(prog="tica")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(["schema", *(sys.argv[1:] if argv is None else argv)])
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
