"""Runs the loops against a live server over one reused aiohttp session.

Each cell is framed by two reads of the target's /metrics, so the batching figures cover
exactly that cell's load, and by two reads of this process's CPU time, so the report says
whether the load generator itself kept up.
"""

from __future__ import annotations

import random
import resource
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
import grpc
from yarl import URL

from carpool.loadgen.grpc_sender import make_grpc_sender
from carpool.loadgen.loops import LoopResult, Send, closed_loop, open_loop, poisson_arrivals
from carpool.loadgen.progress import Progress
from carpool.loadgen.report import CellResult, Mode, level_label
from carpool.loadgen.stats import (
    BatchStats,
    LatencySummary,
    Snapshot,
    has_batch_metrics,
    parse_metrics,
)
from carpool.loadgen.workload import PreparedRequest

# Status recorded for a request that got no HTTP answer (refused, reset, timed out).
NO_RESPONSE = 0
# How long the server has to answer the check before the load starts.
CHECK_TIMEOUT_S = 10.0
# How long a request may take before it counts as failed (`--timeout`).
REQUEST_TIMEOUT_S = 60.0


class ServerUnreachable(RuntimeError):
    """The target gave no HTTP answer at all before the load started."""


@dataclass(frozen=True, slots=True)
class RunSettings:
    url: str
    mode: Mode
    levels: tuple[float, ...]
    duration: float | None = 10.0
    requests: int | None = None
    # /metrics of the target; None for a server that has none (a baseline).
    metrics_url: str | None = None
    warmup_seconds: float = 1.0
    timeout_seconds: float = REQUEST_TIMEOUT_S
    # Poisson schedule seed, so open-loop runs are repeatable.
    seed: int = 0
    progress: bool = True
    # The gRPC address for the `grpc` protocol (host:port); None sends over HTTP to `url`.
    grpc_target: str | None = None


def cpu_seconds() -> float:
    """User plus system CPU time of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def make_sender(
    session: aiohttp.ClientSession, base_url: str, prepared: Sequence[PreparedRequest]
) -> Send:
    """A `send(index)` that posts prepared request `index % len(prepared)`."""
    if not prepared:
        raise ValueError("the workload holds no requests")
    # URLs parsed once here rather than on every request.
    targets = [(URL(base_url.rstrip("/") + request.path), request) for request in prepared]

    async def send(index: int) -> int:
        url, request = targets[index % len(targets)]
        try:
            async with session.post(url, data=request.body, headers=request.headers) as response:
                await response.read()
                return response.status
        except (aiohttp.ClientError, TimeoutError):
            return NO_RESPONSE

    return send


async def read_metrics(session: aiohttp.ClientSession, url: str) -> Snapshot | None:
    """The target's metrics, or None when it serves none (a 404, or not Prometheus text)."""
    try:
        async with session.get(url) as response:
            if response.status != 200:
                return None
            text = await response.text()
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
        return None
    try:
        snapshot = parse_metrics(text)
    except ValueError:
        return None
    return snapshot if has_batch_metrics(snapshot) else None


async def check_answers(session: aiohttp.ClientSession, url: str) -> None:
    """Raise ServerUnreachable unless a GET of `url` gets an HTTP answer, of any status.

    Without it, a load against a port where nothing listens would record thousands of
    instant connection errors, as fast as the loop can send, instead of one clear error.
    """
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=CHECK_TIMEOUT_S)):
            return
    except (aiohttp.ClientError, TimeoutError) as error:
        reason = str(error) or type(error).__name__
        raise ServerUnreachable(f"no answer from {url}, so no load was sent: {reason}") from None


def summarise(
    mode: Mode,
    level: float,
    result: LoopResult,
    items_per_request: float,
    cpu_used: float,
    batching: BatchStats | None,
) -> CellResult:
    ok = [outcome.latency for outcome in result.outcomes if outcome.status == 200]
    errors: dict[str, int] = {}
    for outcome in result.outcomes:
        if outcome.status != 200:
            key = "connection" if outcome.status == NO_RESPONSE else str(outcome.status)
            errors[key] = errors.get(key, 0) + 1
    wall = result.wall_seconds
    return CellResult(
        mode=mode,
        level=level,
        requests=len(result.outcomes),
        ok=len(ok),
        errors=errors,
        wall_seconds=wall,
        throughput_rps=len(ok) / wall if wall > 0 else 0.0,
        items_per_second=len(ok) * items_per_request / wall if wall > 0 else 0.0,
        latency=LatencySummary.of(ok),
        loadgen_cpu_percent=100 * cpu_used / wall if wall > 0 else 0.0,
        batching=batching,
    )


def connection_limit(settings: RunSettings) -> int:
    """Enough sockets that the client never queues a request the loop meant to send."""
    if settings.mode == "concurrency":
        return max(int(level) for level in settings.levels)
    # Open loop: outstanding requests grow when the server falls behind; cap the sockets.
    return 1024


@asynccontextmanager
async def _sender(
    settings: RunSettings, session: aiohttp.ClientSession, prepared: Sequence[PreparedRequest]
) -> AsyncIterator[Send]:
    """HTTP over the session, or gRPC over a channel of its own while the block runs."""
    if settings.grpc_target is None:
        yield make_sender(session, settings.url, prepared)
        return
    async with grpc.aio.insecure_channel(settings.grpc_target) as channel:
        yield make_grpc_sender(channel, prepared, settings.timeout_seconds)


async def run(settings: RunSettings, prepared: Sequence[PreparedRequest]) -> list[CellResult]:
    """Every cell of `settings`, in order, over one session; ServerUnreachable when the
    target does not answer at all."""
    items_per_request = sum(request.items for request in prepared) / len(prepared)
    connector = aiohttp.TCPConnector(limit=connection_limit(settings))
    timeout = aiohttp.ClientTimeout(total=settings.timeout_seconds)
    cells = []
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        _sender(settings, session, prepared) as send,
    ):
        await check_answers(session, settings.url)
        if settings.warmup_seconds > 0:
            # Opens the connections and lets the server reach steady state; not recorded.
            first = settings.levels[0] if settings.mode == "concurrency" else 1
            await closed_loop(send, int(first), duration=settings.warmup_seconds)
        rng = random.Random(settings.seed)
        for level in settings.levels:
            progress = Progress(
                level_label(settings.mode, level),
                duration=settings.duration,
                requests=settings.requests,
                enabled=settings.progress,
            )
            before = (
                await read_metrics(session, settings.metrics_url) if settings.metrics_url else None
            )
            cpu_start = cpu_seconds()
            if settings.mode == "concurrency":
                result = await closed_loop(
                    send,
                    int(level),
                    duration=settings.duration,
                    requests=settings.requests,
                    on_done=progress.update,
                )
            else:
                arrivals = poisson_arrivals(
                    level, rng, duration=settings.duration, requests=settings.requests
                )
                result = await open_loop(send, arrivals, on_done=progress.update)
            cpu_used = cpu_seconds() - cpu_start
            progress.close(len(result.outcomes))
            after = (
                await read_metrics(session, settings.metrics_url) if settings.metrics_url else None
            )
            batching = BatchStats.between(before, after) if before and after else None
            cells.append(
                summarise(settings.mode, level, result, items_per_request, cpu_used, batching)
            )
    return cells
