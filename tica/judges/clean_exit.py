"""Clean exit moved to its room, tica/items/clean_exit/ (its judge: judge.py), and one process's
exit rule to tica.process_exits. These names stay importable here for the tests that read them."""

from tica.items.clean_exit.judge import judge_clean_exit  # noqa: F401
from tica.process_exits import ZERO_TIMEOUT_HINT, exit_problem, exit_problems, recorded_shutdown_timeout  # noqa: F401
