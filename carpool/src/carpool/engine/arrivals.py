"""Which items are likely to arrive soon, for timed dispatch's choice to wait or send.

Two views. Closed-loop callers, who come back soon after their answer: requests answered
and not yet matched by as many new requests are `returning`, due one turnaround (learned:
answer to next arrival) after their answer. Callers who are not back within two turnarounds
(open load, a caller who left) are not counted on. And the mean rate of the other arrivals,
the fresh ones: a caller whose request is queued or in flight cannot send another, so a
closed loop's returns, already counted on as returning callers, are left out of it, and a
lone caller, or a crowd that has gone, is never waited for. The rate is averaged over many
batch cycles, so that a burst reads as the mean rate of the load rather than as the rate
within the burst, whose items are already queued; and no more, so that a rate that has
gone does not linger (a GPU's batch takes milliseconds, a CPU's tens of them).
"""

from __future__ import annotations

import math

# The span the rate is averaged over (exponentially): this many batch cycles, within bounds.
HORIZON_CYCLES = 20
MIN_HORIZON_S = 0.05
MAX_HORIZON_S = 1.0
# Weight of one sample in the running mean of the turnaround.
ALPHA = 0.1
# Callers not back within this many turnarounds of their answer are not coming.
PATIENCE = 2


class Arrivals:
    def __init__(self) -> None:
        self._weight = 0.0  # fresh items, each weighted by exp(-age / horizon)
        self._at = 0.0
        self._returning = 0
        self._answered_at = -math.inf
        self._turnaround_s = 0.0
        self._horizon_s = MAX_HORIZON_S

    def pace(self, batch_s: float) -> None:
        """Average the rate over HORIZON_CYCLES batches of `batch_s`."""
        self._horizon_s = min(MAX_HORIZON_S, max(MIN_HORIZON_S, HORIZON_CYCLES * batch_s))

    def arrived(self, items: int, now: float) -> None:
        # A caller back after the patience ran out is no sample of the turnaround (a pause in
        # the load would teach a turnaround of seconds); the first sample sets it.
        unknown = self._turnaround_s == 0
        if self._returning and (unknown or self.returning(now)):
            gap = now - self._answered_at
            self._turnaround_s = (
                gap if unknown else self._turnaround_s + ALPHA * (gap - self._turnaround_s)
            )
            self._returning -= 1
            return
        self._weight = self._decayed(now) + items
        self._at = now

    def answered(self, requests: int, now: float) -> None:
        """`requests` were answered (their last items were in one batch)."""
        self._returning = self.returning(now) + requests
        self._answered_at = now

    def per_second(self, now: float) -> float:
        """Mean fresh items/s over about the last HORIZON_CYCLES batches."""
        return self._decayed(now) / self._horizon_s

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

    def _decayed(self, now: float) -> float:
        return self._weight * math.exp(-(now - self._at) / self._horizon_s)
