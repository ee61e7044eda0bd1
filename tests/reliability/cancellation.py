"""Cancellation: thousands of callers who hang up at random points, mixed with patient ones.

One implementation for the quick test (`test_cancellation.py`) and the soak
(`bench/soak.py cancellation`). Each caller is one of three kinds, drawn at random:

- `upload`: sends the headers and part of the body, then closes the connection;
- `leave`: sends a whole request and hangs up after a random 0 to `leave_within_s` seconds,
  which lands while it is queued, while its batch runs, or after its answer;
- `stay`: waits for its answer, which must be a correct 200.

Afterwards the queue and in-flight gauges must return to zero and new requests succeed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from reliability.traffic import (
    Outcome,
    body_for,
    call,
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
    callers: int = 2_000
    concurrency: int = 96
    leave_within_s: float = 0.3
    infer_s: float = 0.01
    after: int = 50  # good requests once everyone is gone
    kinds: str = "upload,leave,leave,stay"  # drawn from, uniformly: twice as many who leave
    seed: int = 1


@dataclass
class Report:
    kinds: Counter[str] = field(default_factory=Counter)
    stayed: list[Outcome] = field(default_factory=list)
    after: list[Outcome] = field(default_factory=list)
    idle_after: tuple[float, float] = (-1.0, -1.0)
    client_gone: float = 0.0  # carpool_requests_total{code="499"}
    # The sidecar's RSS after the first half of the callers (its high-water mark for this
    # concurrency) and after the second: a leak shows as growth in the second half.
    rss_half: int = 0
    rss_end: int = 0
    sidecar_exit_code: int | None = None
    tracebacks: int = 0  # in the sidecar's log


def run(folder: Path, plan: Plan) -> Report:
    return asyncio.run(_run(folder, plan))


async def _run(folder: Path, plan: Plan) -> Report:
    report = Report()
    env = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_INFER_S": str(plan.infer_s)}
    args = ("--max-batch-size", "8", "--max-wait-ms", "5", "--timeout-ms", "20000")
    with run_pair(folder, "model_handlers:SlowInferHandler", *args, env=env) as pair:
        sidecar = pair.sidecar
        rng = random.Random(plan.seed)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            gate = asyncio.Semaphore(plan.concurrency)

            async def caller(seed: int) -> None:
                async with gate:
                    await _caller(http, sidecar, plan, random.Random(seed), report)

            half = plan.callers // 2
            await asyncio.gather(*(caller(rng.getrandbits(32)) for _ in range(half)))
            report.rss_half = rss_bytes(sidecar.process.pid)
            await asyncio.gather(*(caller(rng.getrandbits(32)) for _ in range(half, plan.callers)))
            report.idle_after = await until_idle(sidecar, 10.0)
            report.rss_end = rss_bytes(sidecar.process.pid)
            report.after = list(
                await asyncio.gather(
                    *(call(http, sidecar, rows_for(rng, 2), 30) for _ in range(plan.after))
                )
            )
            report.client_gone = metric(sidecar, "carpool_requests_total", code="499")
        report.sidecar_exit_code = sidecar.process.poll()
        report.tracebacks = sidecar.log().count("Traceback")
    return report


async def _caller(
    http: aiohttp.ClientSession,
    sidecar: Sidecar,
    plan: Plan,
    rng: random.Random,
    report: Report,
) -> None:
    kind = rng.choice(plan.kinds.split(","))
    report.kinds[kind] += 1
    rows = rows_for(rng, rng.randint(1, 4))
    if kind == "upload":
        await _partial_upload(sidecar, json.dumps(body_for(rows)).encode(), rng)
    elif kind == "leave":
        task = asyncio.create_task(call(http, sidecar, rows, 30))
        await asyncio.sleep(rng.uniform(0, plan.leave_within_s))
        task.cancel()  # closes the connection, as a client that gives up does
        with contextlib.suppress(asyncio.CancelledError):
            await task
    else:
        report.stayed.append(await call(http, sidecar, rows, 30))


async def _partial_upload(sidecar: Sidecar, body: bytes, rng: random.Random) -> None:
    host, _, port = sidecar.url.removeprefix("http://").partition(":")
    _, writer = await asyncio.open_connection(host, int(port))
    head = (
        f"POST /v2/models/{sidecar.model}/infer HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    writer.write(head + body[: rng.randrange(len(body))])
    await writer.drain()
    await asyncio.sleep(rng.uniform(0, 0.01))
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


def summary(report: Report) -> str:
    return (
        f"callers {dict(report.kinds)}; those who stayed: {dict(statuses(report.stayed))}, "
        f"{latency_summary(report.stayed)}; gauges afterwards (queue, in flight) "
        f"{report.idle_after}; 499s counted {report.client_gone:.0f}; sidecar RSS "
        f"{report.rss_half / MIB:.1f} MiB after half the callers, {report.rss_end / MIB:.1f} MiB "
        f"after all; requests afterwards {dict(statuses(report.after))}"
    )


def broken_promises(report: Report, plan: Plan) -> list[str]:
    broken = []
    if min(report.kinds.values(), default=0) <= plan.callers / 10 / len(report.kinds):
        broken.append(f"a kind of caller was hardly exercised: {dict(report.kinds)}")
    if not all(o.status == 200 and o.correct for o in report.stayed):
        broken.append(f"a patient caller failed: {dict(statuses(report.stayed))}")
    if report.idle_after != (0.0, 0.0):
        broken.append(f"queue and in-flight gauges stayed at {report.idle_after}")
    if report.client_gone <= 0:
        broken.append("no disconnect was counted as 499")
    if not all(o.status == 200 and o.correct for o in report.after):
        broken.append(f"requests afterwards failed: {dict(statuses(report.after))}")
    if report.sidecar_exit_code is not None or report.tracebacks:
        broken.append(f"sidecar exit {report.sidecar_exit_code}, {report.tracebacks} tracebacks")
    if report.rss_end - report.rss_half >= 16 * MIB:
        broken.append(f"sidecar RSS grew {(report.rss_end - report.rss_half) / MIB:.1f} MiB")
    return broken
