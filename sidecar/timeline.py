"""When the model server can start another batch, predicted from the batches it ran.

Two fits of `DurationFit`: `round_trip` learns from batches sent to an idle model server
(their whole round trip: the hop there and back and the model's work), `service` from batches
sent while another ran, as the time from the previous answer to theirs: a model server that
runs batches one at a time starts the next as it answers the last, so that gap is the model's
work alone. The difference of the two is the hop, which a batch must be sent ahead by to
arrive as the model frees.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from carpool.sidecar.durations import DurationFit


@dataclass(frozen=True, slots=True)
class _Running:
    size: int
    sent_at: float
    behind_another: bool  # sent while another batch was at the model server


class ModelTimeline:
    def __init__(self) -> None:
        self.round_trip = DurationFit()
        self.service = DurationFit()
        self._running: dict[int, _Running] = {}  # by token, in the order sent
        self._tokens = 0
        self._last_answer = -math.inf

    def sent(self, size: int, now: float) -> int:
        """Note a batch leaving; the token identifies it to `answered`."""
        self._tokens += 1
        self._running[self._tokens] = _Running(size, now, bool(self._running))
        return self._tokens

    def answered(self, token: int, now: float, learn: bool) -> None:
        """The batch is back; `learn` is False for a failure, whose timing tells nothing."""
        batch = self._running.pop(token)
        if learn:
            if batch.behind_another:
                self.service.record(batch.size, now - max(batch.sent_at, self._last_answer))
            else:
                self.round_trip.record(batch.size, now - batch.sent_at)
        self._last_answer = now

    def ready_at(self) -> float | None:
        """When to send the next batch so that it reaches the model server as the running ones
        are done (or when it was last free); None while nothing has been learned."""
        if not (self.round_trip.known or self.service.known):
            return None
        last = max((finish for _, finish in self._answers()), default=self._last_answer)
        return last - self.hop_s()

    def next_answer(self) -> tuple[int, float] | None:
        """The size of the batch answered next, and when; None when none runs or nothing has
        been learned."""
        if not (self.round_trip.known or self.service.known):
            return None
        return next(self._answers(), None)

    def _answers(self) -> Iterator[tuple[int, float]]:
        """Each running batch's size and predicted answer, in the order they were sent."""
        finish = self._last_answer
        for batch in self._running.values():
            finish = max(
                batch.sent_at + self._round_trip(batch.size), finish + self._service(batch.size)
            )
            yield batch.size, finish

    @property
    def work(self) -> DurationFit:
        """The fit nearest the model's own work: `service` once there is one."""
        return self.service if self.service.known else self.round_trip

    def hop_s(self) -> float:
        if not (self.round_trip.known and self.service.known):
            return 0.0
        # Compared where round trips were measured: a line fitted to a few sizes need not
        # hold far from them.
        size = round(self.round_trip.mean_size)
        return max(0.0, self.round_trip.predict(size) - self.service.predict(size))

    def fixed_s(self) -> float:
        """What one more batch costs beyond its items: its round trip's fixed part, since a
        batch sent to an idle model server leaves it idle for the hop too."""
        return (self.round_trip if self.round_trip.known else self.service).fixed_s

    def _round_trip(self, size: int) -> float:
        if self.round_trip.known:
            return self.round_trip.predict(size)
        return self.service.predict(size)

    def _service(self, size: int) -> float:
        if self.service.known:
            return self.service.predict(size)
        return self.round_trip.predict(size)
