"""Graceful shutdown: SIGTERM to the sidecar while clients keep it busy, as in a rollout.

One implementation for the quick test (`test_shutdown.py`) and the soak
(`bench/soak.py shutdown`). Half the clients open a new connection per request, half keep
their connections alive. Like a load balancer that learns of the SIGTERM late, the clients
go on sending for `lb_lag_s` after it, within the sidecar's drain delay; a poller watches
readiness from the SIGTERM on. Every request sent must get its answer: a reset or an
unanswered request is a request lost in a rollout.
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


@dataclass(frozen=True)
class Plan:
    clients: int = 32
    busy_s: float = 1.0  # load before the SIGTERM
    infer_s: float = 0.1
    batch: int = 4
    drain_delay_s: float = 1.0
    lb_lag_s: float = 0.5  # clients keep sending this long after the SIGTERM
    drain_seconds: float = 10.0
    runs: int = 1
    seed: int = 1


@dataclass
class Report:
    """One SIGTERM."""

    outcomes: list[Outcome] = field(default_factory=list)
    sigterm_at: float = 0.0
    queued_at_sigterm: float = 0.0
    readiness: list[tuple[float, int | None]] = field(default_factory=list)
    exit_code: int | None = None
    exit_seconds: float = 0.0  # SIGTERM -> process gone


def run(folder: Path, plan: Plan) -> list[Report]:
    reports = []
    for index in range(plan.runs):
        (folder / f"run-{index}").mkdir()
        reports.append(asyncio.run(_run(folder / f"run-{index}", plan, index)))
    return reports


async def _run(folder: Path, plan: Plan, index: int) -> Report:
    report = Report()
    env = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_INFER_S": str(plan.infer_s)}
    args = (
        "--max-batch-size", str(plan.batch), "--max-inflight-batches", "1",
        "--drain-seconds", str(plan.drain_seconds), "--timeout-ms", "60000",
        "--drain-delay-seconds", str(plan.drain_delay_s),
    )  # fmt: skip
    with run_pair(folder, "model_handlers:SlowInferHandler", *args, env=env) as pair:
        sidecar = pair.sidecar
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as new,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as kept,
        ):
            stop = asyncio.Event()
            seed = plan.seed * 1000 + index * plan.clients
            clients = [
                asyncio.create_task(
                    _client(kept if i % 2 else new, sidecar, random.Random(seed + i), stop, report)
                )
                for i in range(plan.clients)
            ]
            await asyncio.sleep(plan.busy_s)
            report.queued_at_sigterm = await gauge(sidecar, "carpool_queue_items")
            report.sigterm_at = time.monotonic()
            sidecar.process.send_signal(signal.SIGTERM)
            poller = asyncio.create_task(_poll_readiness(sidecar, report))
            await asyncio.sleep(plan.lb_lag_s)
            stop.set()
            limit = plan.drain_delay_s + plan.drain_seconds + 10
            report.exit_code = await asyncio.to_thread(sidecar.process.wait, limit)
            report.exit_seconds = time.monotonic() - report.sigterm_at
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


def summary(reports: list[Report]) -> str:
    outcomes = [o for report in reports for o in report.outcomes]
    lines = [f"{len(reports)} SIGTERMs, {len(outcomes)} requests {dict(statuses(outcomes))}"]
    for report in reports:
        term = report.sigterm_at
        after = [o for o in report.outcomes if o.status == 200 and o.started + o.seconds > term]
        not_ready = [t - term for t, status in report.readiness if status == 503]
        lines.append(
            f"queued at SIGTERM {report.queued_at_sigterm:.0f}, 200s after it {len(after)}; "
            f"not ready {not_ready[0] if not_ready else float('nan'):.3f}s after SIGTERM; "
            f"exit code {report.exit_code} after {report.exit_seconds:.2f}s"
        )
    return "\n".join(lines)


def broken_promises(reports: list[Report], plan: Plan) -> list[str]:
    return [problem for report in reports for problem in _broken(report, plan)]


def _broken(report: Report, plan: Plan) -> list[str]:
    term = report.sigterm_at
    outcomes = report.outcomes
    answered_after = [o for o in outcomes if o.status == 200 and o.started + o.seconds > term]
    broken = []
    if report.exit_code != 0 or report.exit_seconds >= plan.drain_delay_s + plan.drain_seconds:
        broken.append(f"exit {report.exit_code} after {report.exit_seconds:.2f}s")
    if report.exit_seconds < plan.drain_delay_s:
        broken.append(f"exit {report.exit_seconds:.2f}s after SIGTERM, before the drain delay")
    if not 0 < report.queued_at_sigterm <= len(answered_after):
        broken.append(
            f"{report.queued_at_sigterm} queued at SIGTERM, {len(answered_after)} answered after"
        )
    for o in outcomes:
        # Sent before the port closed, so accepted: lost if not answered, and answered 200.
        if o.status is None:
            broken.append(f"a request got no HTTP answer: {o}, {o.started - term:+.3f}s")
        elif o.status != 200 or not o.correct:
            broken.append(f"a request got {o.status} {o.error}, {o.started - term:+.3f}s")
    not_ready = [t for t, status in report.readiness if status == 503]
    if not not_ready or not_ready[0] - term > 0.25:
        broken.append("readiness did not drop at once")
    elif any(status == 200 for t, status in report.readiness if t > not_ready[0]):
        broken.append("readiness came back after it dropped")
    return broken
