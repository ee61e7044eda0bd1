"""Bodies that stop arriving: short of their Content-Length, or chunked and never ended.

One implementation for the quick test (`test_stalled_body.py`) and the soak
(`bench/soak.py stalled_body`). Connections open one after another, each sends part of a
large body and then stalls: "short" ones send nothing more, "trickle" ones send a small
chunk now and then, forever. A good client keeps calling meanwhile. A thread samples the
sidecar's RSS.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from reliability.traffic import Outcome, call, rows_for, rss_bytes, statuses
from support.sidecar import Sidecar, run_pair

MIB = 1 << 20


@dataclass(frozen=True)
class Plan:
    connections: int = 8  # every other one trickles
    sent_mib: int = 16  # sent by each before it stalls
    declared_mib: int = 48
    body_timeout_s: float = 1.0
    timeout_ms: int = 3_000
    max_reading_mib: int = 64
    rounds: int = 1


@dataclass(frozen=True)
class Stalled:
    kind: str  # "short" or "trickle"
    status: int | None
    seconds: float  # from the request's first byte to its answer
    closed: bool  # the sidecar closed the connection after answering


@dataclass
class Report:
    stalled: list[Stalled] = field(default_factory=list)
    good: list[Outcome] = field(default_factory=list)
    rss_before: int = 0
    rss_peak: int = 0


def run(folder: Path, plan: Plan) -> Report:
    return asyncio.run(_run(folder, plan))


async def _run(folder: Path, plan: Plan) -> Report:
    report = Report()
    args = (
        "--body-timeout-seconds", str(plan.body_timeout_s), "--timeout-ms", str(plan.timeout_ms),
        "--max-reading-bytes", str(plan.max_reading_mib * MIB),
    )  # fmt: skip
    with run_pair(folder, "toy", *args) as pair:
        sidecar = pair.sidecar
        pid = sidecar.process.pid
        async with aiohttp.ClientSession() as http:
            await call(http, sidecar, rows_for(random.Random(0), 2), 10)  # warm
            report.rss_before = report.rss_peak = rss_bytes(pid)
            done = threading.Event()
            sampler = threading.Thread(target=_sample, args=(pid, report, done))
            sampler.start()
            stop = asyncio.Event()
            good = asyncio.create_task(_good_client(http, sidecar, stop, report.good))
            try:
                for _ in range(plan.rounds):
                    senders = []
                    for index in range(plan.connections):
                        kind = "trickle" if index % 2 else "short"
                        senders.append(asyncio.create_task(_stall(sidecar, plan, kind)))
                        await asyncio.sleep(0.05)
                    report.stalled += await asyncio.gather(*senders)
                await asyncio.sleep(plan.body_timeout_s)  # the good client, after the stalls
            finally:
                stop.set()
                await good
                done.set()
                sampler.join()
    return report


def _sample(pid: int, report: Report, done: threading.Event) -> None:
    while not done.wait(0.01):
        report.rss_peak = max(report.rss_peak, rss_bytes(pid))


async def _good_client(
    http: aiohttp.ClientSession, sidecar: Sidecar, stop: asyncio.Event, outcomes: list[Outcome]
) -> None:
    rng = random.Random(1)
    while not stop.is_set():
        outcomes.append(await call(http, sidecar, rows_for(rng, 2), 30))
        await asyncio.sleep(0.05)


async def _stall(sidecar: Sidecar, plan: Plan, kind: str) -> Stalled:
    host, port = sidecar.url.removeprefix("http://").split(":")
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(host, int(port))
    chunked = kind == "trickle"
    framing = (
        "Transfer-Encoding: chunked" if chunked else f"Content-Length: {plan.declared_mib * MIB}"
    )
    head = (
        f"POST /v2/models/{sidecar.model}/infer HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\n{framing}\r\n\r\n"
    )
    answer = asyncio.create_task(reader.readline())
    try:
        writer.write(head.encode())
        block = b" " * MIB
        for _ in range(plan.sent_mib):
            if answer.done():
                break
            writer.write(b"%x\r\n%s\r\n" % (len(block), block) if chunked else block)
            await writer.drain()
        while not answer.done():
            # Short bodies send nothing more; trickles a byte well within the body timeout.
            await asyncio.wait([answer], timeout=plan.body_timeout_s / 3)
            if chunked and not answer.done():
                writer.write(b"1\r\n \r\n")
                await writer.drain()
    except ConnectionError:
        pass  # the sidecar closed it; what it answered first is in `answer`
    try:
        line = await asyncio.wait_for(answer, plan.timeout_ms / 1000 + 10)
        status = int(line.split()[1]) if line else None
        seconds = time.monotonic() - started
        closed = await _closed(reader, plan.body_timeout_s + 2)
    except (TimeoutError, ConnectionError, IndexError, ValueError):
        status, seconds, closed = None, time.monotonic() - started, False
    finally:
        writer.close()
    return Stalled(kind, status, seconds, closed)


async def _closed(reader: asyncio.StreamReader, within_s: float) -> bool:
    """Whether the other side closes the connection within `within_s` (EOF, not a timeout)."""
    try:
        async with asyncio.timeout(within_s):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return True


def summary(report: Report) -> str:
    by_kind = {
        kind: [(s.status, round(s.seconds, 2), s.closed) for s in report.stalled if s.kind == kind]
        for kind in ("short", "trickle")
    }
    return (
        f"stalled (status, s, closed): {by_kind}; good client {dict(statuses(report.good))}, "
        f"slowest {max((o.seconds for o in report.good), default=0):.2f}s; sidecar RSS "
        f"{report.rss_before >> 20} MiB, peak {report.rss_peak >> 20} MiB"
    )


def broken_promises(report: Report, plan: Plan) -> list[str]:
    broken = []
    deadline_s = plan.timeout_ms / 1000
    for stalled in report.stalled:
        # A short body times out, a trickle meets its deadline (both 408); either may be cut
        # at the cap (503).
        allowed = {408, 503}
        if stalled.status not in allowed:
            broken.append(f"a {stalled.kind} body got {stalled.status}, not one of {allowed}")
        if stalled.seconds > deadline_s + 1:
            broken.append(f"a {stalled.kind} body was answered after {stalled.seconds:.2f}s")
        if not stalled.closed:
            broken.append(f"a {stalled.kind} body's connection stayed open after {stalled.status}")
    for outcome in report.good:
        if outcome.status == 503 and outcome.retry_after is None:
            broken.append("a 503 without Retry-After")
        elif outcome.status not in (200, 503) or (outcome.status == 200 and not outcome.correct):
            broken.append(f"the good client got {outcome.status} {outcome.error}")
        if outcome.seconds > 1.0:
            broken.append(f"the good client waited {outcome.seconds:.2f}s")
    if not report.good or report.good[-1].status != 200:
        broken.append("the good client was not served after the stalls")
    grown = report.rss_peak - report.rss_before
    if grown > (plan.max_reading_mib + 32) * MIB:
        broken.append(f"sidecar RSS grew {grown >> 20} MiB, cap {plan.max_reading_mib} MiB")
    return broken
