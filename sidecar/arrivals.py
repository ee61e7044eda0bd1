"""How fast items have been arriving lately, for timed dispatch's wait-or-send choice."""

from __future__ import annotations

import math

# The span the rate is averaged over (exponentially). Many batch cycles long, so that a burst
# (closed-loop callers answered together come back together) reads as the mean rate of the
# load rather than as the rate within the burst, whose items are already queued.
HORIZON_S = 1.0


class ArrivalRate:
    """Items arrived, each weighted by exp(-age / HORIZON_S); divided by HORIZON_S, items/s."""

    def __init__(self) -> None:
        self._weight = 0.0
        self._at = 0.0

    def record(self, items: int, now: float) -> None:
        self._weight = self._decayed(now) + items
        self._at = now

    def per_second(self, now: float) -> float:
        return self._decayed(now) / HORIZON_S

    def _decayed(self, now: float) -> float:
        return self._weight * math.exp(-(now - self._at) / HORIZON_S)
