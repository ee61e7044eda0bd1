"""How fast the model server has been draining the queue, for `Retry-After`."""

from __future__ import annotations

import math
from collections import deque

THROUGHPUT_WINDOW_S = 10.0
MAX_RETRY_AFTER_S = 60


class ThroughputWindow:
    """The answered batches of the last THROUGHPUT_WINDOW_S (failed ones tell nothing)."""

    def __init__(self) -> None:
        # (started, finished, items) of each answered batch, oldest first.
        self._completed: deque[tuple[float, float, int]] = deque()

    def record(self, started: float, finished: float, items: int) -> None:
        self._completed.append((started, finished, items))
        self.prune(finished)

    def prune(self, now: float) -> None:
        while self._completed and self._completed[0][1] < now - THROUGHPUT_WINDOW_S:
            self._completed.popleft()

    def retry_after_s(self, queued: int, now: float) -> int:
        """Seconds until `queued` items have likely drained, 1 to MAX_RETRY_AFTER_S."""
        self.prune(now)
        done = sum(count for _, _, count in self._completed)
        if not done:
            return 1
        # Items per second over the time those batches took, not over the whole window: at
        # the start of a spike most of the window is idle time, which would promise a drain
        # many times slower than the model's.
        busy_since = min(started for started, _, _ in self._completed)
        rate = done / max(now - busy_since, 1e-3)
        return max(1, min(MAX_RETRY_AFTER_S, math.ceil(queued / rate)))
