"""Bisection: when a batch fails, run each half, until only the items that fail alone fail.

One plan serves the model server, whose forward passes run on a worker thread, and
`carpool.batch`, whose function may be a coroutine: `isolate` yields the sub-batches to run
and is sent what each gave (its results, or the error it raised), and `run` or `run_async`
drives it. A single poison item in a batch of n costs about 2 * log2(n) extra runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

# What running a sub-batch gave: one result per item, in order, or the error it raised.
Outcome = Sequence[R] | Exception
Plan = Generator[Sequence[T], Outcome[R], list[R]]


def isolate(
    items: Sequence[T], failed: Callable[[Exception], R], splits: Callable[[Exception], bool]
) -> Plan[T, R]:
    """The results of `items`, running halves of a batch that failed.

    `failed(error)` is the result of an item that failed with `error`; `splits(error)` says
    whether smaller batches could succeed (False: every item of the batch fails with it).
    """
    outcome = yield items
    if not isinstance(outcome, Exception):
        return list(outcome)
    if len(items) == 1 or not splits(outcome):
        return [failed(outcome)] * len(items)
    middle = len(items) // 2
    first = yield from isolate(items[:middle], failed, splits)
    second = yield from isolate(items[middle:], failed, splits)
    return first + second


def run(plan: Plan[T, R], attempt: Callable[[Sequence[T]], Outcome[R]]) -> list[R]:
    """Drive the plan with a blocking `attempt` (which returns, not raises, its error)."""
    try:
        batch = next(plan)
        while True:
            batch = plan.send(attempt(batch))
    except StopIteration as done:
        results: list[R] = done.value
        return results


async def run_async(
    plan: Plan[T, R], attempt: Callable[[Sequence[T]], Awaitable[Outcome[R]]]
) -> list[R]:
    """Drive the plan with a coroutine `attempt` (which returns, not raises, its error)."""
    try:
        batch = next(plan)
        while True:
            batch = plan.send(await attempt(batch))
    except StopIteration as done:
        results: list[R] = done.value
        return results
