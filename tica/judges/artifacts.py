"""The final artifacts moved to their room, tica/items/artifacts/ (their judge: judge.py). These
names stay importable here for the code that reads them."""

from tica.items.artifacts.judge import CONTENT_HASH, judge_artifacts  # noqa: F401
