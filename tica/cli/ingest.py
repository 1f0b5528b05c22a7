"""`tica leg ingest`: results already on disk as sealed legs (tica/ingest.py, docs/receipts.md).

    tica leg ingest bench FILE.json --out LEG_DIR --arm bi1|bi0 [--round R --slot S --concurrency C]
    tica leg ingest verl-metrics FILE.jsonl --out LEG_DIR --arm bi1|bi0 [--producer-version V]
    tica leg ingest verl-mlflow MLRUNS_DIR --out LEG_DIR --arm bi1|bi0 [--run-id ID] [--producer-version V]
        (MLRUNS_DIR: an MLflow file store, one experiment folder in it, or one run folder)
    tica leg ingest verl-wandb HISTORY.jsonl|.json|.csv --out LEG_DIR --arm bi1|bi0 [--producer-version V]
        (HISTORY: a W&B run's history rows with _step, exported from run.scan_history() / run.history())
    tica leg ingest problems FILE.jsonl --out LEG_DIR --arm bi1|bi0 [--contract contract.json]
                                        [--producer NAME --producer-version V]
    tica leg ingest lm-eval OUTPUT_DIR --out LEG_DIR --arm bi1|bi0 [--task TASK]
        (OUTPUT_DIR: lm_eval's --output_path after --log_samples, or one results_*.json in it)

A field the source does not record is unknown in the leg (never invented); the question decides
which unknowns leave a cell inconclusive, and the verdict lists them.

--json prints one JSON object on stdout and nothing else: {"leg", "item", "arm", "source", "file",
"sealed", "exit", "errors", "unknown"}; on bad input {"error": {"file", "field", "message", "line"}}
(the error is on stderr too). Progress of long work goes to stderr, and only to a terminal.

Exit code: 0 the leg is written and sealed; 4 bad input (the file and field are named; nothing
is written). `tica.cli` wires `add_parser` (given the top-level subparsers: it joins `tica leg`,
creating it if absent) and `run`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tica.cli._common import BAD, EXIT_OK, OTHER, Help, Verb
from tica.errors import EXIT_BAD_INPUT, InputError, UsageParser

SOURCES = ("bench", "verl-metrics", "verl-mlflow", "verl-wandb", "problems", "lm-eval")

HELP: dict[Verb, Help] = {
    ("leg", "ingest"): Help(((EXIT_OK, "the leg is written and sealed"), BAD, OTHER),
                            examples=("tica leg ingest bench bench.json --out LEG --arm bi1 --round 1 --slot 1",)),
}


def _leg_subparsers(subparsers: Any) -> Any:
    """The subparsers of `tica leg` (made by `tica leg run`'s add_parser, or here)."""
    leg = subparsers.choices.get("leg")
    if leg is None:
        leg = subparsers.add_parser("leg", help="legs: tica leg run | tica leg ingest")
        return leg.add_subparsers(dest="leg_command", required=True)
    return next(a for a in leg._actions if isinstance(a, argparse._SubParsersAction))


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `leg ingest` to a `tica` subparsers object."""
    p = _leg_subparsers(subparsers).add_parser(
        "ingest", help="wrap a result already on disk (vllm bench serve JSON, verl metrics from its file logger, "
                       "MLflow or W&B, per-problem JSONL, lm_eval --log_samples output) "
                       "as a sealed leg", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", choices=SOURCES, help="what FILE is")
    p.add_argument("file", metavar="FILE", help="the result file, as its producer wrote it")
    p.add_argument("--out", required=True, metavar="LEG_DIR", help="the leg directory (new or empty)")
    p.add_argument("--arm", required=True, choices=("bi1", "bi0"), help="the arm FILE measured (never guessed)")
    p.add_argument("--round", type=int, help="bench: the crossed round (else the JSON's metadata round)")
    p.add_argument("--slot", type=int, choices=(1, 2), help="bench: the arm's place in its round")
    p.add_argument("--concurrency", type=int, help="bench: else the JSON's max_concurrency")
    p.add_argument("--contract", help="problems: the evaluation contract (contract.json); else unknown")
    p.add_argument("--producer", help="problems: what produced FILE (else unknown)")
    p.add_argument("--producer-version",
                   help="verl-metrics, verl-mlflow, verl-wandb, problems: its version (else unknown)")
    p.add_argument("--task", help="lm-eval: the task to read (else the only task in the results file)")
    p.add_argument("--run-id", help="verl-mlflow: the run to read (else the only live run under FILE)")
    p.add_argument("--json", action="store_true", help="print one JSON object (the leg, or the error) only")
    p.set_defaults(func=run)
    return p


def _misplaced(args: argparse.Namespace) -> list[str]:
    allowed = {"bench": {"round", "slot", "concurrency"}, "verl-metrics": {"producer_version"},
               "verl-mlflow": {"run_id", "producer_version"}, "verl-wandb": {"producer_version"},
               "problems": {"contract", "producer", "producer_version"}, "lm-eval": {"task"}}[args.source]
    return [f"--{k.replace('_', '-')}" for k in ("round", "slot", "concurrency", "contract", "producer",
                                                 "producer_version", "task", "run_id")
            if getattr(args, k, None) is not None and k not in allowed]


def _ingest(args: argparse.Namespace) -> Path:
    from tica import ingest

    bad = _misplaced(args)
    if bad:
        raise InputError("<command line>", bad[0], f"does not apply to `tica leg ingest {args.source}`")
    if args.source == "bench":
        return ingest.ingest_bench(args.file, args.out, args.arm, args.round, args.slot, args.concurrency)
    if args.source == "verl-metrics":
        return ingest.ingest_verl_metrics(args.file, args.out, args.arm, args.producer_version)
    if args.source == "verl-mlflow":
        return ingest.ingest_verl_mlflow(args.file, args.out, args.arm, args.run_id, args.producer_version)
    if args.source == "verl-wandb":
        return ingest.ingest_verl_wandb(args.file, args.out, args.arm, args.producer_version)
    if args.source == "lm-eval":
        return ingest.ingest_lm_eval(args.file, args.out, args.arm, args.task)
    return ingest.ingest_problems(args.file, args.out, args.arm, args.contract, args.producer, args.producer_version)


def error_json(err: InputError) -> str:
    """Bad input as `--json` prints it (the shape `tica judge` and `tica plan` print, and the line)."""
    return json.dumps({"error": {"file": err.file, "field": err.field, "message": err.message, "line": err.line}})


def run(args: argparse.Namespace, out=None) -> int:
    """Run `tica leg ingest` from parsed arguments; the exit code."""
    from tica.ingest import leg_unknowns
    from tica.receipts import LEG_FILE

    out = out or sys.stdout
    as_json = getattr(args, "json", False)
    try:
        leg = _ingest(args)
    except InputError as err:
        print(f"tica: error: {err}", file=sys.stderr)
        if as_json:
            print(error_json(err), file=out)
        return EXIT_BAD_INPUT
    if as_json:
        item = json.loads((leg / LEG_FILE).read_text())["item"]
        print(json.dumps({"leg": str(leg), "item": item, "arm": args.arm, "source": args.source,
                          "file": str(Path(args.file)), "sealed": True, "exit": 0, "errors": [],
                          "unknown": leg_unknowns(leg)}, indent=1), file=out)
        return 0
    print(f"leg {leg} sealed: {args.source} {args.arm} <- {Path(args.file)}", file=out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """A parser holding only `leg ingest`, for `python -m tica.cli.ingest`."""
    parser = UsageParser(prog="tica")
    add_parser(parser.add_subparsers(dest="command_name", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(["leg", "ingest", *(sys.argv[1:] if argv is None else argv)])
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
