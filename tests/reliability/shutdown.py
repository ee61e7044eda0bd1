"""Graceful shutdown: SIGTERM to the sidecar while clients keep it busy.

One implementation for the quick test (`test_shutdown.py`) and the soak
(`bench/soak.py shutdown`). Clients open a new connection per request (no keep-alive), so a
request that finds the listener closed fails to connect, and any other failure would be a
request the sidecar accepted and dropped. A poller watches readiness from the SIGTERM on.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from reliability.traffic import Outcome, call, gauge, rows_for, statuses
from support.model_server import SUPPORT_DIR
from support.sidecar import Sidecar, run_pair

# A request that finds the port closed: refused, or reset in the listen backlog as it closes.
CLOSED_PORT = ("ClientConnectorError", "ClientOSError")


@dataclass(frozen=True)
class Plan:
    clients: int = 32
    busy_s: float = 1.0  # load before the SIGTERM
    infer_s: float = 0.1
    batch: int = 4
    drain_seconds: float = 10.0
    seed: int = 1


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)
    sigterm_at: float = 0.0
    queued_at_sigterm: float = 0.0
    readiness: list[tuple[float, int | None]] = field(default_factory=list)
    exit_code: int | None = None
    exit_seconds: float = 0.0  # SIGTERM -> process gone


def run(folder: Path, plan: Plan) -> Report:
    return asyncio.run(_run(folder, plan))


async def _run(folder: Path, plan: Plan) -> Report:
    report = Report()
    env = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_INFER_S": str(plan.infer_s)}
    args = (
        "--max-batch-size", str(plan.batch), "--max-inflight-batches", "1",
        "--drain-seconds", str(plan.drain_seconds), "--timeout-ms", "60000",
    )  # fmt: skip
    with run_pair(folder, "model_handlers:SlowInferHandler", *args, env=env) as pair:
        sidecar = pair.sidecar
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as http:
            stop = asyncio.Event()
            clients = [
                asyncio.create_task(
                    _client(http, sidecar, random.Random(plan.seed + i), stop, report)
                )
                for i in range(plan.clients)
            ]
            await asyncio.sleep(plan.busy_s)
            report.queued_at_sigterm = await gauge(sidecar, "carpool_queue_items")
            report.sigterm_at = time.monotonic()
            sidecar.process.send_signal(signal.SIGTERM)
            poller = asyncio.create_task(_poll_readiness(sidecar, report))
            limit = plan.drain_seconds + 10
            report.exit_code = await asyncio.to_thread(sidecar.process.wait, limit)
            report.exit_seconds = time.monotonic() - report.sigterm_at
            stop.set()
            await asyncio.gather(poller, *clients)
    return report


async def _client(
    http: aiohttp.ClientSession,
    sidecar: Sidecar,
    rng: random.Random,
    stop: asyncio.Event,
    report: Report,
) -> None:
    while not stop.is_set():
        outcome = await call(http, sidecar, rows_for(rng, 1), 60)
        report.outcomes.append(outcome)
        if outcome.status != 200:
            await asyncio.sleep(0.02)


async def _poll_readiness(sidecar: Sidecar, report: Report) -> None:
    while sidecar.process.poll() is None:
        status = await asyncio.to_thread(_ready_status, sidecar)
        report.readiness.append((time.monotonic(), status))
        await asyncio.sleep(0.02)


def _ready_status(sidecar: Sidecar) -> int | None:
    try:
        with urllib.request.urlopen(sidecar.url + "/v2/health/ready", timeout=2) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None  # no longer listening


def summary(report: Report) -> str:
    term = report.sigterm_at
    after = [o for o in report.outcomes if o.status == 200 and o.started + o.seconds > term]
    not_ready = [t - term for t, status in report.readiness if status == 503]
    return (
        f"{len(report.outcomes)} requests {dict(statuses(report.outcomes))}; queued at SIGTERM "
        f"{report.queued_at_sigterm:.0f}, 200s after it {len(after)}; not ready "
        f"{not_ready[0] if not_ready else float('nan'):.3f}s after SIGTERM; exit code "
        f"{report.exit_code} after {report.exit_seconds:.2f}s"
    )


def broken_promises(report: Report, plan: Plan) -> list[str]:
    term = report.sigterm_at
    outcomes = report.outcomes
    answered_after = [o for o in outcomes if o.status == 200 and o.started + o.seconds > term]
    broken = []
    if report.exit_code != 0 or report.exit_seconds >= plan.drain_seconds:
        broken.append(f"exit {report.exit_code} after {report.exit_seconds:.2f}s")
    if not 0 < report.queued_at_sigterm <= len(answered_after):
        broken.append(
            f"{report.queued_at_sigterm} queued at SIGTERM, {len(answered_after)} answered after"
        )
    if not all(o.correct for o in outcomes if o.status == 200):
        broken.append("a 200 with wrong outputs")
    for o in outcomes:
        if o.status == 503 and not ("shutting down" in o.error and o.started + o.seconds > term):
            broken.append(f"a 503 that is not the shutdown refusal: {o}")
        elif o.status is None and not (o.error in CLOSED_PORT and o.started > term):
            broken.append(f"a request sent before SIGTERM went unanswered: {o}")
        elif o.status not in (200, 503, None):
            broken.append(f"an unexpected answer: {o}")
    not_ready = [t for t, status in report.readiness if status == 503]
    last_answer = max((o.started + o.seconds for o in answered_after), default=term)
    if not not_ready or not_ready[0] >= last_answer:
        broken.append("readiness did not drop while answers were still going out")
    elif any(status == 200 for t, status in report.readiness if t > not_ready[0]):
        broken.append("readiness came back after it dropped")
    return broken
