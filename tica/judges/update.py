"""The update moved to its room, tica/items/update/ (its judge: judge.py); the forward and
gradient readings it shares with the forward and backward judges to the core (tica.forward_reading,
tica.grad_reading). These names stay importable here for the tests that read them."""

from tica.items.update.judge import UPDATE_HEADERS, judge_update, rerun_cell, rerun_findings  # noqa: F401
