"""A stand-in model server for the engine: batches take fixed + per-item time, one at a time.

    model = TimedModel(fixed_s=0.002, per_item_s=0.00005)     # the fast stand-in, a GPU
    latencies, registry = await closed_loop(8, 1.0, model, max_wait_ms=5)

It runs batches one at a time, as the model server's single worker thread does (or `lanes`
at a time), `hop_s` away (half there, half back), and answers with the model server's timing
(`BatchTiming`). `slow` gives chosen batches (by their order at the worker) a time of their
own, and with `first_run_s` the first batch of each size takes that long, as a GPU's first
run of a shape does: outliers. Items are the times their callers submitted them at, so a
test can tell when the model could have started each batch. Callers of `load` submit one
item, wait for it, and come back after a short turnaround, for a bounded time. Every time is
the running loop's (`time.monotonic` on asyncio's, or `virtual_time`'s), the engine's too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from carpool.contract.wire import BatchTiming
from carpool.engine.batcher import Batcher
from carpool.engine.metrics import SidecarMetrics
from carpool.engine.pending import BatchKey
from carpool.engine.settings import BatchingSettings

KEY = BatchKey(("x",))
# An engine whose items are the times their callers submitted them, answered with themselves.
Engine = Batcher[float, float]


def now() -> float:
    return asyncio.get_running_loop().time()


@dataclass(frozen=True, slots=True)
class Ran:
    """One batch at the worker."""

    size: int
    submitted: float  # when its oldest item was submitted
    sent: float  # when it left the engine
    started: float
    finished: float


class TimedModel:
    def __init__(
        self,
        fixed_s: float = 0.020,
        per_item_s: float = 0.004,
        lanes: int = 1,
        hop_s: float = 0.0,
        slow: Mapping[int, float] | None = None,
        first_run_s: float = 0.0,
        told: BatchTiming | None = None,
    ) -> None:
        self.fixed_s, self.per_item_s = fixed_s, per_item_s
        self._lanes = asyncio.Semaphore(lanes)
        self.hop_s = hop_s
        self._slow = dict(slow or {})
        self._first_run_s = first_run_s
        self._told = told  # the timing it claims, whatever it measured
        self.ran: list[Ran] = []
        self.answered_at: list[float] = []
        self.at_server = 0  # batches sent and not answered, running or waiting for a lane
        self.most_at_server = 0

    @property
    def sizes(self) -> list[int]:
        return [batch.size for batch in self.ran]

    async def send(
        self, items: Sequence[float], timeout_s: float
    ) -> tuple[list[float], BatchTiming]:
        sent = now()
        self.at_server += 1
        self.most_at_server = max(self.most_at_server, self.at_server)
        try:
            await asyncio.sleep(self.hop_s / 2)
            arrived = now()
            async with self._lanes:
                started = now()
                index = len(self.ran)
                self.ran.append(Ran(len(items), min(items), sent, started, started))
                took = self.fixed_s + self.per_item_s * len(items)
                if self._first_run_s and len(items) not in self.sizes[:-1]:
                    took = self._first_run_s
                took = self._slow.get(index, took)
                await asyncio.sleep(took)
                finished = now()
                self.ran[index] = Ran(len(items), min(items), sent, started, finished)
            await asyncio.sleep(self.hop_s / 2)
        finally:
            self.at_server -= 1
        self.answered_at.append(now())
        # As the model server does: the wait for a lane and the time on it.
        return list(items), self._told or BatchTiming(started - arrived, finished - started)


@dataclass(frozen=True, slots=True)
class Served:
    """An engine in front of a TimedModel, and its metrics."""

    batcher: Engine
    registry: CollectorRegistry

    def batches(self, reason: str) -> float:
        """Batches sent so far for `reason`."""
        sample = self.registry.get_sample_value
        return sample("carpool_batches_total", {"model": "m", "reason": reason}) or 0.0


@asynccontextmanager
async def running(model: TimedModel, **settings: object) -> AsyncIterator[Served]:
    """An engine in front of `model`, its dispatcher running (timed dispatch by default)."""
    registry = CollectorRegistry()
    batcher: Engine = Batcher(
        BatchingSettings(**{"dispatch": "timed", **settings}),  # type: ignore[arg-type]
        model,
        SidecarMetrics(registry, "m"),
        asyncio.get_running_loop().time,
    )
    dispatcher = asyncio.create_task(batcher.run())
    try:
        yield Served(batcher, registry)
    finally:
        dispatcher.cancel()
        await asyncio.gather(dispatcher, return_exceptions=True)


async def load(
    served: Served, callers: int, seconds: float, turnaround_s: float = 0.001
) -> list[float]:
    """Closed-loop callers for `seconds`: their requests' latencies."""
    end = now() + seconds
    latencies: list[float] = []

    async def caller(number: int) -> None:
        while (started := now()) < end:
            await served.batcher.submit([started], KEY, started + 30)
            latencies.append(now() - started)
            # Callers come back spread out, as over real connections.
            await asyncio.sleep(turnaround_s * (1 + number % 4))

    await asyncio.gather(*(caller(number) for number in range(callers)))
    return latencies


async def closed_loop(
    callers: int, seconds: float, model: TimedModel, turnaround_s: float = 0.001, **settings: object
) -> tuple[list[float], CollectorRegistry]:
    """Each caller's request latencies over `seconds`, and the metrics."""
    async with running(model, **settings) as served:
        latencies = await load(served, callers, seconds, turnaround_s)
    return latencies, served.registry
