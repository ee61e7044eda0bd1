"""When the model server can start another batch, predicted from the batches it ran.

The model server times every batch it answers (`wire.BatchTiming`): how long the batch
waited for the worker and how long the worker took. `worker` learns the worker's time by
batch size; `prepare` the wait of batches that found the worker free, which is their
preprocessing (ahead of the worker, when the model server pipelines); the hop is what the
round trip adds to the model server's own time, there and back. The worker runs batches one
at a time, so each running batch is predicted to start once it has arrived and been
prepared, or once the one before it ends, whichever is later; the next batch should leave
half a hop and its preparation before the last running one ends. A sender that does not time
its batches (an in-process function), or whose timing cannot be (negative, not finite, longer
than the round trip), counts the whole round trip as the worker's. Times are learned per
length bucket (`durations.BucketedFit`), and every estimate, the hop's too, is robust to
outliers: a batch that took a second does not make the next ones wait.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterator
from dataclasses import dataclass

from carpool.contract.wire import BatchTiming
from carpool.engine.durations import BucketedFit, RecentMedian

# Round trips the hop is the median of: more than a batch size's window, as the hop of every
# batch is a sample of the same thing.
HOP_WINDOW = 16


@dataclass(frozen=True, slots=True)
class _Running:
    size: int
    bucket: Hashable  # the length bucket of its items (BatchKey.bucket)
    sent_at: float
    alone: bool  # nothing else was at the model server when it left


class ModelTimeline:
    def __init__(self) -> None:
        self.worker = BucketedFit()
        self.prepare = BucketedFit()
        self._hop = RecentMedian(HOP_WINDOW)
        self._running: dict[int, _Running] = {}  # by token, in the order sent
        self._tokens = 0
        # When the worker finished the batch answered last, in the sidecar's time.
        self._free_at = -math.inf

    def sent(self, size: int, bucket: Hashable, now: float) -> int:
        """Note a batch leaving; the token identifies it to `answered`."""
        self._tokens += 1
        self._running[self._tokens] = _Running(size, bucket, now, not self._running)
        return self._tokens

    def answered(self, token: int, now: float, timing: BatchTiming | None, learn: bool) -> None:
        """The batch is back; `learn` is False for a failure, whose timing tells nothing."""
        batch = self._running.pop(token)
        if learn:
            round_trip = now - batch.sent_at
            if timing is None or not _possible(timing, round_trip):
                timing = BatchTiming(0.0, round_trip)
            self.worker.record(batch.size, batch.bucket, timing.worker_s, now)
            if batch.alone:
                self.prepare.record(batch.size, batch.bucket, timing.queued_s, now)
            self._hop.add(max(0.0, round_trip - timing.queued_s - timing.worker_s))
        self._free_at = now - self.hop_s() / 2

    @property
    def known(self) -> bool:
        return self.worker.known

    def ready_at(self) -> float | None:
        """When to send the next batch so that it is ready at the model server as the running
        ones are done (or when it was last free); None while nothing has been learned."""
        if not self.known:
            return None
        free = self.worker_free_at()
        lead = self.hop_s() / 2
        if self.prepare.known:
            prepare = self.prepare.pooled
            lead += prepare.predict(round(prepare.mean_size))
        return free - lead

    def worker_free_at(self) -> float:
        """When the worker is predicted to finish the running batches (or was last free)."""
        return max((end for _, end in self._worker_ends()), default=self._free_at)

    def next_answer(self) -> tuple[int, float] | None:
        """The size of the batch answered next, and when; None when none runs or nothing has
        been learned."""
        if not self.known:
            return None
        return next(((size, end + self.hop_s() / 2) for size, end in self._worker_ends()), None)

    def _worker_ends(self) -> Iterator[tuple[int, float]]:
        """Each running batch's size and when the worker is predicted to finish it, in the
        order they were sent."""
        free = self._free_at
        for batch in self._running.values():
            arrived = batch.sent_at + self.hop_s() / 2
            if self.prepare.known:
                arrived += self.prepare.predict(batch.size, batch.bucket)
            free = max(arrived, free) + self.worker.predict(batch.size, batch.bucket)
            yield batch.size, free

    def hop_s(self) -> float:
        return self._hop.value

    def fixed_s(self, bucket: Hashable) -> float:
        """What one more batch of the bucket costs beyond its items: the worker's fixed part,
        and for a batch sent to an idle model server, the hop and preparing it too."""
        fixed = self.worker.fixed_s(bucket) + self.hop_s()
        if self.prepare.known:
            fixed += self.prepare.fixed_s(bucket)
        return fixed


def _possible(timing: BatchTiming, round_trip: float) -> bool:
    """Whether the model server's account fits in the round trip the sidecar measured: a
    negative, infinite or longer one is no measurement (a broken or lying model server),
    and learning it would hold batches back or send them early."""
    spent = timing.queued_s + timing.worker_s
    return timing.queued_s >= 0 and timing.worker_s >= 0 and spent <= round_trip
