"""Crash soak: clients keep calling the sidecar while its model server is SIGKILLed and restarted.

One implementation for the quick test (`test_crash.py`) and the soak (`bench/soak.py crash`).
The model server runs in a thread that starts it, lets the clients work, kills it (SIGKILL, no
goodbye), and starts it again on the same socket; the clients run on the event loop, each
backing off 50 ms after a 503 as a well-behaved caller would.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from reliability.traffic import Outcome, call, latency_summary, rows_for, statuses
from support.model_server import SUPPORT_DIR, run_model_server
from support.sidecar import Sidecar, metric, run_sidecar

BACKOFF_AFTER_503_S = 0.05


@dataclass(frozen=True)
class Plan:
    clients: int = 32
    restarts: int = 3
    up_seconds: float = 1.5  # load on a healthy model server before each kill
    timeout_ms: int = 10_000  # the sidecar's request deadline
    infer_s: float = 0.0  # time per batch; above 0, most kills land on a batch in flight
    max_requests_per_client: int = 200_000  # a bound; the crash loop ends the run first
    seed: int = 1


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)
    restart_seconds: list[float] = field(default_factory=list)  # kill -> model server ready
    resume_seconds: list[float] = field(default_factory=list)  # ready -> first 200 after it
    counted_by_sidecar: dict[str, float] = field(default_factory=dict)
    sidecar_exit_code: int | None = None


def run(folder: Path, plan: Plan) -> Report:
    return asyncio.run(_run(folder, plan))


async def _run(folder: Path, plan: Plan) -> Report:
    report = Report()
    socket = folder / "model.sock"
    args = ("--timeout-ms", str(plan.timeout_ms), "--max-batch-size", "16")
    with run_sidecar(folder, f"unix://{socket}", *args, wait_ready=False) as sidecar:
        stop = threading.Event()
        connector = aiohttp.TCPConnector(limit=plan.clients)
        async with aiohttp.ClientSession(connector=connector) as http:
            clients = [
                asyncio.create_task(_client(http, sidecar, plan, index, stop, report.outcomes))
                for index in range(plan.clients)
            ]
            try:
                await asyncio.to_thread(_crash_loop, folder, plan, stop, report)
            finally:
                stop.set()
                await asyncio.gather(*clients)
            report.counted_by_sidecar = {
                code: metric(sidecar, "carpool_requests_total", code=code)
                for code in {str(outcome.status) for outcome in report.outcomes}
            }
        report.sidecar_exit_code = sidecar.process.poll()
    return report


async def _client(
    http: aiohttp.ClientSession,
    sidecar: Sidecar,
    plan: Plan,
    index: int,
    stop: threading.Event,
    outcomes: list[Outcome],
) -> None:
    rng = random.Random(plan.seed * 1000 + index)
    client_timeout_s = plan.timeout_ms / 1000 + 5  # past the sidecar's own deadline
    for _ in range(plan.max_requests_per_client):
        if stop.is_set():
            return
        outcome = await call(http, sidecar, rows_for(rng, rng.randint(1, 3)), client_timeout_s)
        outcomes.append(outcome)
        if outcome.status != 200:
            await asyncio.sleep(BACKOFF_AFTER_503_S)


def _first_success(outcomes: list[Outcome], since: float, timeout_s: float) -> float:
    """When the first 200 that ended at or after `since` ended; waits for one to come."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ends = [o.started + o.seconds for o in list(outcomes) if o.status == 200]
        first = min((end for end in ends if end >= since), default=None)
        if first is not None:
            return first
        time.sleep(0.02)
    raise AssertionError(f"no 200 within {timeout_s}s after the model server came back")


def _crash_loop(folder: Path, plan: Plan, stop: threading.Event, report: Report) -> None:
    killed_at = 0.0
    handler, env = "toy", {}
    if plan.infer_s > 0:
        handler = "model_handlers:SlowInferHandler"
        env = {"PYTHONPATH": str(SUPPORT_DIR), "CARPOOL_TEST_INFER_S": str(plan.infer_s)}
    for round_ in range(plan.restarts + 1):
        with run_model_server(folder, handler, "--model-name", "toy", env=env) as server:
            ready_at = time.monotonic()
            if round_:
                report.restart_seconds.append(ready_at - killed_at)

            first = _first_success(report.outcomes, ready_at, timeout_s=30.0)
            report.resume_seconds.append(max(0.0, first - ready_at))
            time.sleep(plan.up_seconds)
            if round_ == plan.restarts:
                stop.set()  # the clients stop while the model server still serves
                return
            server.process.kill()
            killed_at = time.monotonic()
            server.process.wait()


def summary(report: Report) -> str:
    outcomes = report.outcomes
    failed = [o for o in outcomes if o.status != 200]
    restarts = ", ".join(f"{s:.2f}" for s in report.restart_seconds)
    resumed = ", ".join(f"{s:.2f}" for s in report.resume_seconds)
    return (
        f"{len(outcomes)} requests {dict(statuses(outcomes))}; all: {latency_summary(outcomes)}; "
        f"503s: {latency_summary(failed)}; kill -> model server ready (s): {restarts}; "
        f"ready -> first 200 (s): {resumed}"
    )


def broken_promises(report: Report, plan: Plan) -> list[str]:
    outcomes = report.outcomes
    counts = statuses(outcomes)
    broken = []
    if not set(counts) <= {200, 503}:
        broken.append(f"answers other than 200 and 503: {dict(counts)}")
    if not all(o.correct for o in outcomes if o.status == 200):
        broken.append("a 200 with wrong outputs")
    if report.counted_by_sidecar != {str(k): float(v) for k, v in counts.items()}:
        broken.append(f"the sidecar counted {report.counted_by_sidecar}, clients saw {counts}")
    failed = [o for o in outcomes if o.status == 503]
    if not failed:
        broken.append("no 503 at all: the crashes were not noticed")
    elif max(o.seconds for o in failed) >= plan.timeout_ms / 1000:
        broken.append("a 503 waited out the deadline")
    if len(report.resume_seconds) != plan.restarts + 1 or max(report.resume_seconds) >= 5.0:
        broken.append(f"service did not resume within 5 s of a restart: {report.resume_seconds}")
    if report.sidecar_exit_code is not None:
        broken.append(f"the sidecar exited with {report.sidecar_exit_code}")
    return broken
