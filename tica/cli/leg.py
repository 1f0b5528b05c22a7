"""`tica leg run`: run any command as a sealed leg of one arm (docs/leg-run.md).

    tica leg run --out LEG --item throughput --arm bi0 --round 1 --slot 1 \\
        --server-cmd "vllm serve MODEL --port 8000 --shutdown-timeout 30" \\
        -- vllm bench serve --base-url http://127.0.0.1:8000 --model MODEL --dataset-name random \\
           --random-input-len 64 --random-output-len 16 --ignore-eos --max-concurrency 2 \\
           --num-prompts 8 --num-warmups 2 --save-result --result-filename /tmp/b.json

    tica leg run --out LEG --item quality --arm bi1 --collect lm_eval_out=out/ -- lm_eval --model vllm ...
    tica leg run --out LEG --item forward --arm bi1 --trainer external --collect metrics.jsonl=run/m.jsonl \\
        -- python train.py ...

The arm sets VLLM_BATCH_INVARIANT for the command (and a --server-cmd server). The leg records
every switch set, the versions of the command's own Python, the device, when the command ran,
how it and the server ended, the files it wrote (--collect, and a `vllm bench serve` result file,
collected as bench.json), and is sealed, also when the command fails.

--json prints one JSON object on stdout and nothing else: {"leg", "item", "arm", "sealed", "exit",
"processes", "collected", "errors"} (errors: why the leg is not clean); the command's own output
then goes to stderr. On bad input: {"error": {"file", "field", "message", "line"}} (and the error on
stderr).

Exit code: 0 the leg is sealed and every recorded process exited 0; 1 the leg is sealed but the
command or the server did not end cleanly, or something it names was not collected (the leg is
evidence of that); 4 bad input (nothing ran, nothing written). `tica.cli` wires `add_parser` and
`run`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tica.cli._common import BAD, EXIT_NO, EXIT_OK, OTHER, Help, Verb
from tica.errors import EXIT_BAD_INPUT, InputError, UsageParser

CLI = "<command line>"

HELP: dict[Verb, Help] = {
    ("leg",): Help(((EXIT_OK, "the leg is written and sealed (run: every recorded process exited 0)"),
                    (EXIT_NO, "run: the leg is sealed, but the command or the server did not end cleanly"), BAD, OTHER),
                   examples=("tica leg run --help", "tica leg ingest --help")),
    ("leg", "run"): Help(((EXIT_OK, "the leg is sealed and every recorded process exited 0"),
                          (EXIT_NO, "the leg is sealed, but the command or the server did not end cleanly, or "
                                    "something named was not collected"), BAD, OTHER),
                         examples=("tica leg run --out LEG --item forward --arm bi1 -- python train.py",)),
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `leg run` to a `tica` subparsers object."""
    from tica.leg_choices import ITEMS, ROLES, TRAINERS

    leg = subparsers.add_parser("leg", help="legs: tica leg run ... -- COMMAND (any command as a sealed leg)")
    sub = leg.add_subparsers(dest="leg_command", required=True)
    p = sub.add_parser("run", help="run a command as a sealed leg of one arm", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, metavar="LEG_DIR", help="the leg directory (new or empty)")
    p.add_argument("--item", required=True, choices=ITEMS)
    p.add_argument("--arm", required=True, choices=("bi1", "bi0"), help="sets VLLM_BATCH_INVARIANT=1|0")
    p.add_argument("--round", type=int, help="throughput: the crossed round (else read from --metadata round=R)")
    p.add_argument("--slot", type=int, help="throughput: the arm's place in its round, 1 or 2")
    p.add_argument("--concurrency", type=int, help="throughput: else read from --max-concurrency")
    p.add_argument("--role", choices=ROLES,
                   help="the command's process role (default: client for quality/throughput/clean_exit, else trainer)")
    p.add_argument("--trainer", choices=TRAINERS, help="leg.json trainer (default: not recorded)")
    p.add_argument("--collect", action="append", default=[], metavar="[NAME=]SRC",
                   help="a file or folder the command writes, copied into the leg as NAME (default: its name); repeatable")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="a further switch for the command and the server (recorded); repeatable")
    p.add_argument("--cwd", help="the command's working directory (default: here)")
    p.add_argument("--timeout", type=float, help="seconds before the command gets SIGTERM (then SIGKILL); recorded")
    p.add_argument("--python", help="the command's Python, when TICA cannot tell it (a shell script): its versions are recorded")
    p.add_argument("--weights", help="the model folder the leg served/trained: resolved_config.weights_hash")
    p.add_argument("--source", help="a git checkout the command ran from: leg.json source.commit")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (the leg, or the error) only; the command's output goes to stderr")
    srv = p.add_argument_group("server (one of --server-cmd, --server-pid)")
    srv.add_argument("--server-cmd", metavar="'CMD ARGS'",
                     help="a server to start first (one shell-quoted string), stopped with SIGTERM after the command")
    srv.add_argument("--server-url", help="its base URL, polled at /health (default: from the server's --host/--port)")
    srv.add_argument("--server-timeout", type=float, default=600.0, help="seconds to wait for /health (default 600)")
    srv.add_argument("--server-stop-timeout", type=float,
                     help="seconds after SIGTERM before SIGKILL (default: its --shutdown-timeout + 60)")
    srv.add_argument("--server-pid", type=int, help="a server already running: its end is recorded as observed")
    srv.add_argument("--server-log", help="that server's log: its lines written during the leg are read and kept")
    p.add_argument("leg_argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    p.set_defaults(func=run)
    return p


def _env_pairs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise InputError(CLI, "--env", f"{item!r}: KEY=VALUE")
        out[key] = value
    return out


def spec_from(args: argparse.Namespace):
    from tica.leg_run import LegRunSpec, split_server_cmd

    command = list(args.leg_argv)
    if command[:1] == ["--"]:
        command = command[1:]
    path = lambda v: Path(v) if v else None  # noqa: E731
    return LegRunSpec(
        out=Path(args.out), item=args.item, arm=args.arm, command=command, round=args.round, slot=args.slot,
        concurrency=args.concurrency, role=args.role, trainer=args.trainer, collect=list(args.collect),
        env=_env_pairs(args.env), cwd=path(args.cwd), timeout=args.timeout,
        server_cmd=split_server_cmd(args.server_cmd) if args.server_cmd is not None else None,
        server_url=args.server_url, server_timeout=args.server_timeout, server_stop_timeout=args.server_stop_timeout,
        server_pid=args.server_pid, server_log=path(args.server_log), weights=path(args.weights),
        python=path(args.python), source=path(args.source))


def _bad_input(err: InputError, as_json: bool, out) -> int:
    from tica.cli.ingest import error_json

    print(f"tica: error: {err}", file=sys.stderr)
    if as_json:
        print(error_json(err), file=out)
    return EXIT_BAD_INPUT


def run(args: argparse.Namespace, out=None) -> int:
    """Run `tica leg run` from parsed arguments; the exit code."""
    from tica.leg_run import LegRunError, run_leg

    out = out or sys.stdout
    as_json = getattr(args, "json", False)
    try:
        spec = spec_from(args)
        # with --json, stdout holds the one JSON object: the command's output is echoed to stderr
        echo = getattr(sys.stderr if as_json else sys.stdout, "buffer", None)
        outcome = run_leg(spec, echo=echo)
    except LegRunError as err:
        return _bad_input(InputError(CLI, err.field, err.message), as_json, out)
    except InputError as err:
        return _bad_input(err, as_json, out)
    meta = outcome.meta
    problems = outcome.problems
    code = 0 if not problems else 1
    collected = meta["resolved_config"].get("collected") or {}
    if as_json:
        print(json.dumps({"leg": str(outcome.leg_dir), "item": meta["item"], "arm": meta["arm"], "sealed": True,
                          "exit": code, "processes": meta["processes"], "collected": collected,
                          "errors": problems}, indent=1, default=str), file=out)
        return code
    print(f"leg {outcome.leg_dir} sealed: {meta['item']} {meta['arm']}", file=out)
    for p in meta["processes"]:
        print(f"  {p['role']:<11} pid {p['pid']}: {p['end_state']} (exit code {p['exit_code']})", file=out)
    for name, src in collected.items():
        print(f"  collected {name} <- {src}", file=out)
    for why in problems:
        print(f"  problem: {why}", file=out)
    return code


def build_parser() -> argparse.ArgumentParser:
    """A parser holding only `leg run`, for `python -m tica.cli.leg`."""
    parser = UsageParser(prog="tica")
    add_parser(parser.add_subparsers(dest="command_name", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(["leg", *(sys.argv[1:] if argv is None else argv)])
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
