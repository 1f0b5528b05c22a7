"""The backward moved to its room, tica/items/backward/ (its judge: judge.py); reading a trainer's
gradients and its gradient check is core (tica.grad_reading), shared with the update. The judge
stays importable here for the judges' entry point (tica.judges) and the code that reads it."""

from tica.items.backward.judge import judge_backward  # noqa: F401
