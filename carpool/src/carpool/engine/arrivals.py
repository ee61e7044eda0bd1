"""Which items are likely to arrive soon, for timed dispatch's choice to wait or send.

Two views. The mean rate of arrivals, as if callers were independent. And closed-loop
callers, who come back soon after their answer: requests answered and not yet matched by as
many new requests are `returning`, due one turnaround (learned: answer to next arrival)
after their answer. Callers who are not back within two turnarounds (open load, a caller
who left) are not counted on.
"""

from __future__ import annotations

import math

# The span the rate is averaged over (exponentially). Many batch cycles long, so that a burst
# (closed-loop callers answered together come back together) reads as the mean rate of the
# load rather than as the rate within the burst, whose items are already queued.
HORIZON_S = 1.0
# Weight of one sample in the running mean of the turnaround.
ALPHA = 0.1
# Callers not back within this many turnarounds of their answer are not coming.
PATIENCE = 2


class Arrivals:
    def __init__(self) -> None:
        self._weight = 0.0  # items arrived, each weighted by exp(-age / HORIZON_S)
        self._at = 0.0
        self._returning = 0
        self._answered_at = -math.inf
        self._turnaround_s = 0.0

    def arrived(self, items: int, now: float) -> None:
        self._weight = self._weight * math.exp(-(now - self._at) / HORIZON_S) + items
        self._at = now
        # A caller back after the patience ran out is no sample of the turnaround (a pause in
        # the load would teach a turnaround of seconds); the first sample sets it.
        unknown = self._turnaround_s == 0
        if self._returning and (unknown or self.returning(now)):
            gap = now - self._answered_at
            self._turnaround_s = (
                gap if unknown else self._turnaround_s + ALPHA * (gap - self._turnaround_s)
            )
            self._returning -= 1

    def answered(self, requests: int, now: float) -> None:
        """`requests` were answered (their last items were in one batch)."""
        self._returning = self.returning(now) + requests
        self._answered_at = now

    def per_second(self, now: float) -> float:
        """Mean items/s of the last HORIZON_S or so."""
        return self._weight * math.exp(-(now - self._at) / HORIZON_S) / HORIZON_S

    def returning(self, now: float) -> int:
        """Callers answered who are likely on their way back."""
        if now > self._answered_at + PATIENCE * self._turnaround_s:
            return 0
        return self._returning

    def back(self, answered_at: float) -> tuple[float, float]:
        """When callers answered at `answered_at` are likely back, and when to stop waiting."""
        return (
            answered_at + self._turnaround_s,
            answered_at + PATIENCE * self._turnaround_s,
        )

    @property
    def last_answer(self) -> float:
        return self._answered_at
