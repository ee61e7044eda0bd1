"""Overload: requests arrive at three times what the model can serve, for a bounded time.

One implementation for the quick test (`test_overload.py`) and the soak
(`bench/soak.py overload`). The model takes `infer_s` per batch of at most `batch` items, one
batch at a time, so its capacity is `batch / infer_s` items per second; arrivals are open-loop
(a new request every 1 / rate seconds, whether or not earlier ones were answered), as from
many independent users. A sampler reads the queue gauge and the sidecar's RSS all along.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from reliability.traffic import (
    Outcome,
    call,
    gauge,
    latency_summary,
    rows_for,
    rss_bytes,
    statuses,
    until_idle,
)
from support.model_server import SUPPORT_DIR
from support.sidecar import Sidecar, metric, run_pair

MIB = 1024 * 1024


@dataclass(frozen=True)
class Plan:
    seconds: float = 4.0
    load_factor: float = 3.0
    batch: int = 4
    infer_s: float = 0.1
    max_queue_items: int = 32
    timeout_ms: int = 5_000
    seed: int = 1

    @property
    def capacity(self) -> float:
        """Items per second the model can serve."""
        return self.batch / self.infer_s


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)
    max_queue_items: float = 0.0
    rss_baseline: int = 0  # the sidecar's RSS after warm-up, before the overload
    rss_samples: list[int] = field(default_factory=list)
    refused_by_sidecar: float = 0.0  # carpool_rejected_total{reason="queue_full"}
    idle_after: tuple[float, float] = (-1.0, -1.0)  # queue, in-flight gauges afterwards

    @property
    def rss_growth(self) -> int:
        return max(self.rss_samples, default=self.rss_baseline) - self.rss_baseline


def run(folder: Path, plan: Plan) -> Report:
    return asyncio.run(_run(folder, plan))


async def _run(folder: Path, plan: Plan) -> Report:
    report = Report()
    env = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_INFER_S": str(plan.infer_s)}
    args = (
        "--max-batch-size", str(plan.batch), "--max-inflight-batches", "1",
        "--max-queue-items", str(plan.max_queue_items), "--timeout-ms", str(plan.timeout_ms),
    )  # fmt: skip
    with run_pair(folder, "model_handlers:SlowInferHandler", *args, env=env) as pair:
        sidecar = pair.sidecar
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            # Warm up the sidecar's code paths so the baseline RSS is not its cold start.
            rng = random.Random(plan.seed)
            await asyncio.gather(*(call(http, sidecar, rows_for(rng, 1), 30) for _ in range(8)))
            report.rss_baseline = rss_bytes(sidecar.process.pid)
            done = asyncio.Event()
            sampler = asyncio.create_task(_sample(sidecar, report, done))
            try:
                report.outcomes = await _offer(http, sidecar, plan, rng)
            finally:
                done.set()
                await sampler
            report.idle_after = await until_idle(sidecar, 10.0)
            report.refused_by_sidecar = metric(
                sidecar, "carpool_rejected_total", reason="queue_full"
            )
    return report


async def _offer(
    http: aiohttp.ClientSession, sidecar: Sidecar, plan: Plan, rng: random.Random
) -> list[Outcome]:
    rate = plan.capacity * plan.load_factor
    total = int(rate * plan.seconds)
    client_timeout_s = plan.timeout_ms / 1000 + 5
    start = time.monotonic()
    calls = []
    for index in range(total):
        await asyncio.sleep(max(0.0, start + index / rate - time.monotonic()))
        calls.append(asyncio.create_task(call(http, sidecar, rows_for(rng, 1), client_timeout_s)))
    return list(await asyncio.gather(*calls))


async def _sample(sidecar: Sidecar, report: Report, done: asyncio.Event) -> None:
    while not done.is_set():
        report.max_queue_items = max(
            report.max_queue_items, await gauge(sidecar, "carpool_queue_items")
        )
        report.rss_samples.append(rss_bytes(sidecar.process.pid))
        await asyncio.sleep(0.05)


def summary(report: Report) -> str:
    outcomes = report.outcomes
    accepted = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status == 429]
    retry_after = sorted({int(o.retry_after) for o in refused if o.retry_after})
    return (
        f"{len(outcomes)} requests {dict(statuses(outcomes))}; queue max "
        f"{report.max_queue_items:.0f}; sidecar RSS {report.rss_baseline / MIB:.1f} MiB + "
        f"{report.rss_growth / MIB:.1f} MiB at most; accepted: {latency_summary(accepted)}; "
        f"refused: {latency_summary(refused)}, Retry-After values {retry_after}"
    )


def broken_promises(report: Report, plan: Plan) -> list[str]:
    outcomes = report.outcomes
    counts = statuses(outcomes)
    accepted = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status == 429]
    broken = []
    if not set(counts) <= {200, 429}:
        broken.append(f"answers other than 200 and 429: {dict(counts)}")
    # At load_factor times capacity, about 1 - 1 / load_factor cannot be served.
    if len(refused) < len(outcomes) * (1 - 1 / plan.load_factor) / 2:
        broken.append(f"only {len(refused)} of {len(outcomes)} refused: the excess queued")
    if not all(o.retry_after is not None and int(o.retry_after) >= 1 for o in refused):
        broken.append("a 429 without a Retry-After of at least 1 s")
    # A full queue drains in max_queue_items / capacity seconds; the hint may round up and
    # lag a little, but must not send callers away for many times longer.
    drain_s = math.ceil(plan.max_queue_items / plan.capacity)
    longest = max((int(o.retry_after or 0) for o in refused), default=0)
    if longest > drain_s + 2:
        broken.append(f"Retry-After up to {longest}s for a queue that drains in {drain_s}s")
    if report.refused_by_sidecar != len(refused):
        broken.append(f"sidecar counted {report.refused_by_sidecar} queue_full, saw {len(refused)}")
    if not 0 < report.max_queue_items <= plan.max_queue_items:
        broken.append(f"queue reached {report.max_queue_items} (limit {plan.max_queue_items})")
    if report.rss_growth >= 32 * MIB:
        broken.append(f"sidecar RSS grew {report.rss_growth / MIB:.1f} MiB")
    if not accepted or not all(o.correct for o in accepted):
        broken.append("no accepted request, or a 200 with wrong outputs")
    elif max(o.seconds for o in accepted) >= plan.timeout_ms / 1000:
        broken.append("an accepted request took longer than its deadline")
    if report.idle_after != (0.0, 0.0):
        broken.append(f"queue and in-flight gauges stayed at {report.idle_after}")
    return broken
