"""Progress of long work (fingerprinting weights, reading or sealing many files) on stderr.

Shown only when stderr is a terminal, and then only for work still running after DELAY_S (a
quick job prints nothing). TICA_PROGRESS=1 forces it on at once (any stream), TICA_PROGRESS=0
off. It never writes to stdout, so `--json` output is the same with it on or off.

Standard library only: seal.py and fingerprint.py, which producers on GPU nodes import, use it
(tqdm would be a dependency those modules promise not to have).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from tica import leg_settings

ENV = leg_settings.PROGRESS
DELAY_S = 0.5
REFRESH_S = 0.1


def enabled(stream: TextIO) -> bool | None:
    """True: shown at once (forced); None: shown after DELAY_S (a terminal); False: never."""
    forced = leg_settings.progress()
    if forced is not None:
        return forced
    try:
        return None if stream.isatty() else False
    except (AttributeError, ValueError):  # a closed or stand-in stream
        return False


def _amount(n: float, unit: str) -> str:
    if unit != "B":
        return f"{int(n)}"
    for scale, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= scale:
            return f"{n / scale:.1f} {name}"
    return f"{int(n)} B"


class Progress:
    """`label: done/total unit` rewritten in place on stderr; thread-safe; a context manager.

        with Progress("fingerprint /models/m", total=nbytes, unit="B") as bar:
            bar.update(len(chunk))
    """

    def __init__(self, label: str, total: float, unit: str = "files", stream: TextIO | None = None) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream or sys.stderr
        mode = enabled(self.stream)
        self._on = mode is not False
        self._start = time.monotonic()
        self._show_after = self._start + (0.0 if mode else DELAY_S)
        self._last = 0.0
        self._done = 0.0
        self._shown = False
        self._width = 0
        self._drawn = -1.0
        self._lock = threading.Lock()

    def update(self, n: float = 1) -> None:
        if not self._on:
            return
        with self._lock:
            self._done += n
            now = time.monotonic()
            if now >= self._show_after and (now - self._last >= REFRESH_S or self._done >= self.total):
                self._draw(now)

    def _draw(self, now: float) -> None:
        unit = "" if self.unit == "B" else f" {self.unit}"
        text = f"\r{self.label}: {_amount(self._done, self.unit)}/{_amount(self.total, self.unit)}{unit}"
        if self.unit == "B" and now > self._start:
            text += f" ({_amount(self._done / (now - self._start), 'B')}/s)"
        pad = " " * max(0, self._width - len(text))  # blank what a longer earlier line left
        try:
            self.stream.write(text + pad)
            self.stream.flush()
        except (OSError, ValueError):
            self._on = False
            return
        self._last, self._shown, self._width, self._drawn = now, True, len(text), self._done

    def close(self) -> None:
        """End the line (only if anything was shown)."""
        with self._lock:
            if self._on and self._shown:
                if self._drawn != self._done:
                    self._draw(time.monotonic())
                try:
                    self.stream.write("\n")
                    self.stream.flush()
                except (OSError, ValueError):
                    pass
            self._on = False

    def __enter__(self) -> "Progress":
        if self._on and time.monotonic() >= self._show_after:
            with self._lock:
                self._draw(time.monotonic())
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
