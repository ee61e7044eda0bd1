"""The batching engine alone: one-item requests from many callers through a sender that
answers at once, so the figure is the engine's own cost per request.

    python bench/engine.py --callers 200 --requests 20000 --rounds 5

Prints requests/s of each round, and per CPU-second of the process (the steadier figure on
a shared machine), and their medians. No network, no model: queueing,
dispatch, fan-out and the futures, on one event loop (uvloop when installed).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from carpool import event_loop
from carpool.engine.batcher import Batcher
from carpool.engine.metrics import SidecarMetrics
from carpool.engine.pending import BatchKey
from carpool.engine.settings import BatchingSettings

KEY = BatchKey(None)


class Echo:
    """A sender that answers every item with itself, at once."""

    async def send(self, items: Sequence[int], timeout_s: float) -> tuple[Sequence[int], None]:
        return items, None


async def one_round(callers: int, requests: int, settings: BatchingSettings) -> tuple[float, float]:
    """Requests per second, and per CPU-second of this process (steadier on a shared machine)."""
    batcher: Batcher[int, int] = Batcher(
        settings, Echo(), SidecarMetrics(CollectorRegistry(), "engine")
    )
    dispatcher = asyncio.create_task(batcher.run())
    loop = asyncio.get_running_loop()
    each = requests // callers

    async def caller(first: int) -> None:
        for n in range(first, first + each):
            (answer,) = await batcher.submit([n], KEY, loop.time() + 60)
            assert answer == n

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(caller(c * each) for c in range(callers)))
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    dispatcher.cancel()
    await asyncio.gather(dispatcher, return_exceptions=True)
    return callers * each / elapsed, callers * each / cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--callers", type=int, default=200)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-batch-size", type=int, default=32)
    args = parser.parse_args()
    settings = BatchingSettings(max_batch_size=args.max_batch_size, max_queue_items=10**6)
    rates, per_cpu = [], []
    for round_ in range(args.rounds):
        rate, cpu_rate = event_loop.run(one_round(args.callers, args.requests, settings))
        rates.append(rate)
        per_cpu.append(cpu_rate)
        print(f"round {round_}: {rate:,.0f} requests/s, {cpu_rate:,.0f} per CPU-second", flush=True)
    print(
        f"median {statistics.median(rates):,.0f} requests/s, "
        f"{statistics.median(per_cpu):,.0f} per CPU-second over {args.rounds} rounds"
    )


if __name__ == "__main__":
    main()
