"""A model server that stops answering without dying (SIGSTOP), then wakes up (SIGCONT).

One implementation for the quick test (`test_stall.py`) and the soak (`bench/soak.py stall`).
A crash closes the socket, so the sidecar notices at once; a hung process (a stuck driver, a
swapping host, a debugger) keeps its socket open and answers nothing. Clients keep calling
through `stalls` such pauses; the request deadline is short, so waiting it out is visible.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from reliability.traffic import Outcome, call, latency_summary, rows_for, statuses
from support.sidecar import Sidecar, run_pair


@dataclass(frozen=True)
class Plan:
    clients: int = 8
    stalls: int = 2
    stall_seconds: float = 3.0
    between_s: float = 2.0  # serving time before, between and after the stalls
    timeout_ms: int = 1_000
    seed: int = 1


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)
    stalled: list[tuple[float, float]] = field(default_factory=list)  # (SIGSTOP, SIGCONT) times


def run(folder: Path, plan: Plan) -> Report:
    return asyncio.run(_run(folder, plan))


async def _run(folder: Path, plan: Plan) -> Report:
    report = Report()
    with run_pair(folder, "toy", "--timeout-ms", str(plan.timeout_ms)) as pair:
        model = pair.model_server.process
        stop = asyncio.Event()
        async with aiohttp.ClientSession() as http:
            clients = [
                asyncio.create_task(_client(http, pair.sidecar, plan, i, stop, report.outcomes))
                for i in range(plan.clients)
            ]
            try:
                for _ in range(plan.stalls):
                    await asyncio.sleep(plan.between_s)
                    model.send_signal(signal.SIGSTOP)
                    paused = time.monotonic()
                    await asyncio.sleep(plan.stall_seconds)
                    model.send_signal(signal.SIGCONT)
                    report.stalled.append((paused, time.monotonic()))
                await asyncio.sleep(plan.between_s)
            finally:
                model.send_signal(signal.SIGCONT)
                stop.set()
                await asyncio.gather(*clients)
    return report


async def _client(
    http: aiohttp.ClientSession,
    sidecar: Sidecar,
    plan: Plan,
    index: int,
    stop: asyncio.Event,
    outcomes: list[Outcome],
) -> None:
    rng = random.Random(plan.seed * 1000 + index)
    client_timeout_s = plan.timeout_ms / 1000 + 10  # far past the deadline: a hang shows
    while not stop.is_set():
        outcome = await call(http, sidecar, rows_for(rng, 1), client_timeout_s)
        outcomes.append(outcome)
        if outcome.status != 200:
            await asyncio.sleep(0.05)


def summary(report: Report) -> str:
    outcomes = report.outcomes
    failed = [o for o in outcomes if o.status != 200]
    return (
        f"{len(outcomes)} requests {dict(statuses(outcomes))}; failures answered in "
        f"{latency_summary(failed)}; first 200 after each SIGCONT (s): "
        f"{[round(_resumed(report, cont), 2) for _, cont in report.stalled]}"
    )


def _resumed(report: Report, since: float) -> float:
    ends = [o.started + o.seconds for o in report.outcomes if o.status == 200]
    return min((end for end in ends if end >= since), default=float("inf")) - since


def broken_promises(report: Report, plan: Plan) -> list[str]:
    outcomes = report.outcomes
    counts = statuses(outcomes)
    broken = []
    if not set(counts) <= {200, 503, 504}:
        broken.append(f"answers other than 200, 503 and 504: {dict(counts)}")
    if not all(o.correct for o in outcomes if o.status == 200):
        broken.append("a 200 with wrong outputs")
    # Answered by the deadline, give or take scheduling: nobody hangs with the model.
    slowest = max((o.seconds for o in outcomes), default=0.0)
    if slowest > plan.timeout_ms / 1000 + 1.0:
        broken.append(f"a request took {slowest:.2f}s with a {plan.timeout_ms} ms deadline")
    for paused, cont in report.stalled:
        # Sent while stopped, with a deadline that passes before SIGCONT: must be refused.
        during = [o for o in outcomes if paused + 0.5 < o.started < cont - plan.timeout_ms / 1000]
        if not during or any(o.status == 200 for o in during):
            broken.append("no prompt refusals while the model server was stopped")
        if _resumed(report, cont) > 5.0:
            broken.append("service did not resume within 5 s of SIGCONT")
    return broken
