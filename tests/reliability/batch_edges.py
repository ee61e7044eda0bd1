"""`carpool.batch` around a function that hangs, exits or answers nonsense, among good calls.

One implementation for the quick test (`test_batch_edges.py`) and the soak (`bench/soak.py
batch_edges`). Callers call the wrapped function (2 * x + 1) concurrently, round after
round, each with a 2 s deadline; a few of each round ask it to misbehave: to hang (deadline
200 ms; an async one forever, a sync one for 1 s), to raise SystemExit, or to return None.
`group_by` keeps each kind in batches of its own, so a good caller's answer never depends
on a bad one's. Run twice: with an async function, and with a sync one (on threads), called
through `blocking`.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from reliability.traffic import percentile

import carpool
from carpool.batching import DeadlineExceeded, FunctionAborted, SidecarError
from carpool.engine.errors import BadModelResponse

GOOD, HANG, EXIT, NONE = "good", "hang", "exit", "none"
# How long the gauges may take to read nothing queued and nothing in flight after the last
# answer: a leaked count never does.
SETTLE_POLLS, SETTLE_POLL_S = 100, 0.01
# What a caller of each kind must get: its answer, or this error.
EXPECTED: dict[str, type[Exception] | None] = {
    GOOD: None,
    HANG: DeadlineExceeded,
    EXIT: FunctionAborted,
    NONE: BadModelResponse,
}


@dataclass(frozen=True)
class Plan:
    rounds: int = 6
    callers: int = 48  # per round
    bad_per_kind: int = 1  # per round, of each bad kind
    good_timeout_ms: int = 2000
    hang_timeout_ms: int = 200
    sync_hang_s: float = 1.0  # a sync call that hangs returns this long after it started
    max_batch_size: int = 16


@dataclass
class Report:
    """One run: async or sync."""

    kind: str
    outcomes: list[tuple[str, str, float]] = field(default_factory=list)  # caller, got, seconds
    calls: Counter[str] = field(default_factory=Counter)  # function calls, by the batch's kind
    batches: Counter[str] = field(default_factory=Counter)  # batches, by kind (from the calls)
    after: str = ""  # a good call once the rounds are over
    queued: float = -1.0
    inflight: float = -1.0


@dataclass(frozen=True)
class _Call:
    kind: str
    value: int


def _answer(items: list[_Call]) -> list[int] | None:
    """The function's body once it did not hang: exit, None, or 2 * x + 1."""
    kinds = {item.kind for item in items}
    if EXIT in kinds:
        sys.exit(3)
    if NONE in kinds:
        return None
    return [2 * item.value + 1 for item in items]


def run(plan: Plan) -> list[Report]:
    return [asyncio.run(_run_async(plan)), _run_sync(plan)]


def _batched(plan: Plan, function: Any, registry: CollectorRegistry) -> Any:
    return carpool.batch(
        max_batch_size=plan.max_batch_size,
        max_wait_ms=5,
        group_by=lambda call: call.kind,
        registry=registry,
        name="double",
    )(function)


def _schedule(plan: Plan, round_: int) -> list[_Call]:
    bad = [kind for kind in (HANG, EXIT, NONE) for _ in range(plan.bad_per_kind)]
    calls = [_Call(GOOD, round_ * 1000 + n) for n in range(plan.callers - len(bad))]
    # The bad calls among the first, so that good calls queue behind a hung batch.
    return [_Call(kind, -1) for kind in bad] + calls


def _timeout(plan: Plan, call: _Call) -> int:
    return plan.hang_timeout_ms if call.kind == HANG else plan.good_timeout_ms


def _outcome(call: _Call, result: object, seconds: float) -> tuple[str, str, float]:
    if isinstance(result, Exception):
        return call.kind, f"{type(result).__name__}: {result}", seconds
    correct = result == 2 * call.value + 1
    return call.kind, "correct" if correct else f"wrong: {result!r}", seconds


async def _run_async(plan: Plan) -> Report:
    report = Report("async")
    never = asyncio.Event()

    async def double(items: list[_Call]) -> list[int] | None:
        report.calls[items[0].kind] += 1
        if any(item.kind == HANG for item in items):
            await never.wait()
        return _answer(items)

    registry = CollectorRegistry()
    batched = _batched(plan, double, registry)

    async def one(call: _Call) -> tuple[str, str, float]:
        started = time.monotonic()
        try:
            result: object = await batched(call, timeout_ms=_timeout(plan, call))
        except SidecarError as error:
            result = error
        return _outcome(call, result, time.monotonic() - started)

    try:
        for round_ in range(plan.rounds):
            report.outcomes += await asyncio.gather(*map(one, _schedule(plan, round_)))
        report.after = (await one(_Call(GOOD, 7)))[1]
        for _ in range(SETTLE_POLLS):  # the last batch counts itself out after its callers
            if not any(_gauges(registry)):
                break
            await asyncio.sleep(SETTLE_POLL_S)
    finally:
        report.queued, report.inflight = _gauges(registry)
        await batched.aclose()
    return report


def _run_sync(plan: Plan) -> Report:
    report = Report("sync")
    release = threading.Event()
    lock = threading.Lock()

    def double(items: list[_Call]) -> list[int] | None:
        with lock:
            report.calls[items[0].kind] += 1
        if any(item.kind == HANG for item in items):
            release.wait(
                plan.sync_hang_s
            )  # a thread cannot be stopped: it runs on past its deadline
        return _answer(items)

    registry = CollectorRegistry()
    batched = _batched(plan, double, registry)

    def one(call: _Call) -> tuple[str, str, float]:
        started = time.monotonic()
        try:
            result: object = batched.blocking(call, timeout_ms=_timeout(plan, call))
        except SidecarError as error:
            result = error
        return _outcome(call, result, time.monotonic() - started)

    try:
        for round_ in range(plan.rounds):
            with ThreadPoolExecutor(plan.callers) as callers:
                report.outcomes += callers.map(one, _schedule(plan, round_))
        report.after = one(_Call(GOOD, 7))[1]
        for _ in range(SETTLE_POLLS):
            if not any(_gauges(registry)):
                break
            time.sleep(SETTLE_POLL_S)
    finally:
        report.queued, report.inflight = _gauges(registry)
        release.set()
        batched.close()
    return report


def _gauges(registry: CollectorRegistry) -> tuple[float, float]:
    labels = {"model": "double"}
    queued = registry.get_sample_value("carpool_queue_items", labels)
    inflight = registry.get_sample_value("carpool_inflight_batches", labels)
    return queued or 0.0, inflight or 0.0


def summary(reports: list[Report]) -> str:
    lines = []
    for report in reports:
        good = [seconds for kind, _, seconds in report.outcomes if kind == GOOD]
        got = Counter((kind, answer.split(":")[0]) for kind, answer, _ in report.outcomes)
        lines.append(
            f"{report.kind}: {dict(got)}; good callers p50 {1000 * percentile(good, 0.5):.0f} "
            f"ms, p99 {1000 * percentile(good, 0.99):.0f} ms, max {1000 * max(good):.0f} ms; "
            f"function calls {dict(report.calls)}; afterwards {report.after}, queue "
            f"{report.queued:.0f}, in flight {report.inflight:.0f}"
        )
    return "\n".join(lines)


def broken_promises(reports: list[Report], plan: Plan) -> list[str]:
    broken = []
    for report in reports:
        for kind, answer, seconds in report.outcomes:
            expected = EXPECTED[kind]
            want = "correct" if expected is None else expected.__name__
            if not answer.startswith(want):
                broken.append(f"{report.kind}: a {kind} caller got {answer}")
            limit_ms = plan.hang_timeout_ms if kind == HANG else plan.good_timeout_ms
            if seconds > limit_ms / 1000 + 0.5:
                broken.append(f"{report.kind}: a {kind} caller waited {seconds:.2f} s")
        # One call per bad batch: a wrong answer or an exit is never split into halves.
        for kind in (EXIT, NONE):
            if report.calls[kind] > plan.rounds * plan.bad_per_kind:
                broken.append(f"{report.kind}: {report.calls[kind]} calls for {kind} batches")
        if report.after != "correct" or report.queued or report.inflight:
            broken.append(
                f"{report.kind} afterwards: {report.after}, queue {report.queued}, "
                f"in flight {report.inflight}"
            )
    return broken
