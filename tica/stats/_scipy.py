"""`scipy.stats`, imported on first use: importing it costs ~2.7 s on these machines, and every
process that judges anything (Dagster steps, the CLI) imports the stats modules whether or not
it computes a statistic."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


class _OnFirstUse:
    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str) -> Any:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)


stats: Any = _OnFirstUse("scipy.stats")
