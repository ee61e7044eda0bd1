"""A one-line progress bar on stderr, redrawn at most a few times a second."""

from __future__ import annotations

import sys
import time
from typing import TextIO

_WIDTH = 30
_REDRAW_SECONDS = 0.25


class Progress:
    """Shows a cell's elapsed time against its duration, or its requests against the count."""

    def __init__(
        self,
        label: str,
        *,
        duration: float | None,
        requests: int | None,
        stream: TextIO | None = None,
        enabled: bool = True,
    ) -> None:
        self._label = label
        self._duration = duration
        self._requests = requests
        self._stream = stream if stream is not None else sys.stderr
        # A bar redrawn with carriage returns only makes sense on a terminal, not in a log.
        self._enabled = enabled and self._stream.isatty()
        self._started = time.monotonic()
        self._drawn = -_REDRAW_SECONDS

    def _fraction(self, done: int, elapsed: float) -> float:
        shares = []
        if self._duration:
            shares.append(elapsed / self._duration)
        if self._requests:
            shares.append(done / self._requests)
        return min(1.0, max(shares, default=0.0))

    def update(self, done: int) -> None:
        if not self._enabled:
            return
        now = time.monotonic()
        if now - self._drawn < _REDRAW_SECONDS:
            return
        self._drawn = now
        self._draw(done, now - self._started)

    def _draw(self, done: int, elapsed: float) -> None:
        filled = int(self._fraction(done, elapsed) * _WIDTH)
        bar = "#" * filled + "." * (_WIDTH - filled)
        rate = done / elapsed if elapsed > 0 else 0.0
        self._stream.write(f"\r{self._label} [{bar}] {elapsed:5.1f}s {done} requests {rate:8.1f}/s")
        self._stream.flush()

    def close(self, done: int) -> None:
        if not self._enabled:
            return
        self._draw(done, time.monotonic() - self._started)
        self._stream.write("\n")
        self._stream.flush()
