"""Poison items through the sidecar: each shares a batch with other callers' good items.

One implementation for the quick test (`test_poison.py`) and the soak (`bench/soak.py poison`).
Each round, `callers` requests of 1 to 3 rows arrive together at a sidecar with fixed dispatch
and a long window, so they form one batch; one row of a few random callers is NaN, which
makes the toy model raise inside its forward pass. The model server isolates the failing items
by bisection; only the callers holding one may fail.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from reliability.traffic import Outcome, call, rows_for, statuses
from support.sidecar import metric, run_pair


@dataclass(frozen=True)
class Plan:
    rounds: int = 3
    callers: int = 24
    poisoned_per_round: int = 1
    seed: int = 1


@dataclass
class Round:
    outcomes: list[Outcome]
    poisoned: set[int]
    batches: float  # batches the sidecar sent for this round


@dataclass
class Report:
    rounds: list[Round] = field(default_factory=list)


def run(folder: Path, plan: Plan) -> Report:
    return asyncio.run(_run(folder, plan))


async def _run(folder: Path, plan: Plan) -> Report:
    report = Report()
    # The window is long and the batch big enough for every caller of a round.
    args = ["--dispatch", "fixed", "--max-wait-ms", "300", "--max-queue-items", "4096"]
    args += ["--max-batch-size", str(3 * plan.callers)]
    model_args = ("--max-batch-size", str(3 * plan.callers))
    with run_pair(folder, "toy", *args, model_args=model_args) as pair:
        sidecar = pair.sidecar
        rng = random.Random(plan.seed)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            for _ in range(plan.rounds):
                callers = [rows_for(rng, rng.randint(1, 3)) for _ in range(plan.callers)]
                poisoned = set(rng.sample(range(plan.callers), plan.poisoned_per_round))
                for index in poisoned:
                    row = rng.choice(callers[index])
                    row[rng.randrange(len(row))] = math.nan
                before = await asyncio.to_thread(metric, sidecar, "carpool_batch_size_count")
                # JSON has no NaN: every caller uses the binary tensor data extension.
                outcomes = await asyncio.gather(
                    *(call(http, sidecar, rows, 30, binary=True) for rows in callers)
                )
                after = await asyncio.to_thread(metric, sidecar, "carpool_batch_size_count")
                report.rounds.append(Round(list(outcomes), poisoned, after - before))
    return report


def summary(report: Report) -> str:
    outcomes = [o for round_ in report.rounds for o in round_.outcomes]
    batches = [round_.batches for round_ in report.rounds]
    poisoned = sum(len(round_.poisoned) for round_ in report.rounds)
    return (
        f"{len(report.rounds)} rounds, {len(outcomes)} callers, {poisoned} poisoned: "
        f"{dict(statuses(outcomes))}; batches per round {sorted(set(batches))}"
    )


def broken_promises(report: Report, plan: Plan) -> list[str]:
    broken = []
    for number, round_ in enumerate(report.rounds):
        if round_.batches != 1:
            broken.append(f"round {number}: {round_.batches} batches, not one shared batch")
        for index, outcome in enumerate(round_.outcomes):
            if index in round_.poisoned:
                if not (outcome.status == 500 and "NaN" in outcome.error):
                    broken.append(f"round {number}: poisoned caller got {outcome}")
            elif not (outcome.status == 200 and outcome.correct):
                broken.append(f"round {number}: a good caller beside the poison got {outcome}")
    return broken
