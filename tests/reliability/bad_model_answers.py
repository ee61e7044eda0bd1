"""A model server whose answers are malformed or lie about their timing.

One implementation for the quick test (`test_bad_model_answers.py`) and the soak
(`bench/soak.py bad_model_answers`). A scripted model server (`support.scripted_model_server`)
stands behind a real sidecar. First it answers every item with an error whose status is no
integer (`"status": "teapot"`), while `callers` clients call in a loop; then it answers
correctly but says each batch waited and ran for a negative time, while one caller calls
alone, one request at a time.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from reliability.traffic import Outcome, call, latency_summary, rows_for, statuses
from support.scripted_model_server import scripted_model_server, toy_results
from support.sidecar import run_sidecar


@dataclass(frozen=True)
class Plan:
    callers: int = 8
    seconds: float = 2.0  # of each phase
    queued_s: float = -0.5  # what the lying model server says
    worker_s: float = -0.5
    seed: int = 9


@dataclass
class Report:
    malformed: list[Outcome] = field(default_factory=list)
    lone: list[Outcome] = field(default_factory=list)
    log_lines: int = 0
    tracebacks: int = 0


def run(folder: Path, plan: Plan) -> Report:
    report = Report()
    for phase in ("teapot", "liar"):
        (folder / phase).mkdir()

    def teapot(items: list[Any]) -> dict[str, Any]:
        return {"results": [{"error": "broken", "status": "teapot"} for _ in items]}

    with (
        scripted_model_server(folder / "teapot", teapot) as url,
        run_sidecar(folder, url) as sidecar,
    ):
        before = len(sidecar.log().splitlines())
        report.malformed = asyncio.run(_callers(sidecar, plan, plan.callers))
        lines = sidecar.log().splitlines()[before:]
        report.log_lines = len(lines)
        report.tracebacks = sum("Traceback" in line for line in lines)

    def liar(items: list[Any]) -> dict[str, Any]:
        timing = {"queued_s": plan.queued_s, "worker_s": plan.worker_s}
        return {"results": toy_results(items), **timing}

    with (
        scripted_model_server(folder / "liar", liar) as url,
        run_sidecar(folder, url) as sidecar,
    ):
        report.lone = asyncio.run(_callers(sidecar, plan, 1))
    return report


async def _callers(sidecar: Any, plan: Plan, count: int) -> list[Outcome]:
    outcomes: list[Outcome] = []
    until = time.monotonic() + plan.seconds

    async def caller(number: int) -> None:
        rng = random.Random(plan.seed + number)
        async with aiohttp.ClientSession() as http:
            while time.monotonic() < until:
                outcomes.append(await call(http, sidecar, rows_for(rng, rng.randint(1, 3)), 10))

    await asyncio.gather(*(caller(number) for number in range(count)))
    return outcomes


def summary(report: Report) -> str:
    return (
        f"malformed answers: {len(report.malformed)} requests {dict(statuses(report.malformed))}, "
        f"{latency_summary(report.malformed)}; sidecar log {report.log_lines} lines, "
        f"{report.tracebacks} tracebacks. Lying timings: a lone caller's "
        f"{len(report.lone)} requests {dict(statuses(report.lone))}, "
        f"{latency_summary(report.lone)}"
    )


def broken_promises(report: Report, plan: Plan) -> list[str]:
    broken = []
    if not report.malformed or statuses(report.malformed).keys() != {502}:
        broken.append(f"malformed answers gave {dict(statuses(report.malformed))}, not 502s")
    batches = len(report.malformed)  # at least one batch per request, at most one line each
    if report.tracebacks or report.log_lines > batches:
        broken.append(
            f"{report.log_lines} log lines ({report.tracebacks} tracebacks) for {batches} requests"
        )
    wrong = [o for o in report.lone if o.status != 200 or not o.correct]
    if wrong or not report.lone:
        broken.append(f"the lone caller got {dict(statuses(report.lone))}")
    slow = [o.seconds for o in report.lone if o.seconds > 0.1]
    if len(slow) > len(report.lone) // 20:
        broken.append(f"the lone caller waited over 0.1 s {len(slow)} times: {slow[:5]}")
    return broken
