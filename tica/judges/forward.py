"""The forward moved to its room, tica/items/forward/ (its judge: judge.py); reading a forward
receipt is core (tica.forward_reading), shared with the update. The judge stays importable here
for the judges' entry point (tica.judges) and the code that reads it."""

from tica.items.forward.judge import judge_forward  # noqa: F401
