"""`carpool.batch`: the sidecar's engine around a function, called as a user would."""

from __future__ import annotations

import asyncio
import contextlib
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

import carpool
from carpool.batching import (
    STUCK_THREADS,
    DeadlineExceeded,
    QueueFull,
    SidecarError,
    Unavailable,
)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    if name == "carpool_requests_total":
        labels = {"protocol": "inprocess", **labels}
    return registry.get_sample_value(name, labels) or 0.0


async def test_200_concurrent_callers_each_get_their_own_answer_in_batches() -> None:
    registry = CollectorRegistry()
    sizes: list[int] = []

    @carpool.batch(max_batch_size=32, max_wait_ms=5, registry=registry)
    async def double(items: list[int]) -> list[int]:
        sizes.append(len(items))
        await asyncio.sleep(0.01)
        return [2 * item for item in items]

    try:
        results = await asyncio.gather(*(double(i) for i in range(200)))
    finally:
        await double.aclose()
    assert results == [2 * i for i in range(200)]
    assert sum(sizes) == 200 and max(sizes) == 32 and len(sizes) <= 10
    assert sample(registry, "carpool_requests_total", model="double", code="200") == 200
    assert sample(registry, "carpool_batch_size_count", model="double") == len(sizes)


async def test_a_poison_item_fails_alone_and_slot_errors_reach_their_caller() -> None:
    @carpool.batch(max_batch_size=16, max_wait_ms=20)
    async def invert(items: list[float]) -> list[float | Exception]:
        if 0.0 in items:
            raise ZeroDivisionError("cannot invert 0")
        return [ValueError("negative") if item < 0 else 1 / item for item in items]

    try:
        outcomes = await asyncio.gather(
            *(invert(float(i)) for i in [1, 2, 0, 4, -5, 8]), return_exceptions=True
        )
    finally:
        await invert.aclose()
    assert outcomes[0:2] == [1.0, 0.5] and outcomes[3] == 0.25 and outcomes[5] == 0.125
    assert isinstance(outcomes[2], ZeroDivisionError)
    assert isinstance(outcomes[4], ValueError)


async def test_deadline_cancellation_priority_and_queue_bound() -> None:
    registry = CollectorRegistry()
    release = asyncio.Event()
    seen: list[list[str]] = []

    @carpool.batch(max_batch_size=2, max_wait_ms=1, max_queue_items=4, registry=registry)
    async def echo(items: list[str]) -> list[str]:
        seen.append(items)
        await release.wait()
        return items

    try:
        busy = asyncio.create_task(echo("first"))  # occupies the one batch slot
        await asyncio.sleep(0.05)
        low = [asyncio.create_task(echo(f"low{i}")) for i in range(2)]
        await asyncio.sleep(0.01)
        high = asyncio.create_task(echo("high", priority=1))
        gone = asyncio.create_task(echo("gone"))
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFull):
            await echo("one too many")
        gone.cancel()
        await asyncio.sleep(0)
        with pytest.raises(DeadlineExceeded):
            await echo("impatient", timeout_ms=20)
        release.set()
        assert await asyncio.gather(busy, high, *low) == ["first", "high", "low0", "low1"]
    finally:
        await echo.aclose()
    # The high-priority item overtook the queue; the cancelled one never reached the function.
    assert seen == [["first"], ["high", "low0"], ["low1"]]
    assert sample(registry, "carpool_rejected_total", model="echo", reason="queue_full") == 1
    assert sample(registry, "carpool_requests_total", model="echo", code="504") == 1


@pytest.mark.parametrize("timeout_ms", [math.nan, math.inf])
async def test_a_deadline_that_is_no_time_is_refused(timeout_ms: float) -> None:
    """NaN or infinity would be no deadline at all: a call that never returns would hold
    its caller forever."""

    @carpool.batch(max_batch_size=2, max_wait_ms=1)
    async def echo(items: list[int]) -> list[int]:
        return items

    try:
        with pytest.raises(ValueError, match="timeout_ms must be a finite number"):
            await asyncio.wait_for(echo(1, timeout_ms=timeout_ms), 2)
        assert await echo(2) == 2
    finally:
        await echo.aclose()


async def test_a_call_cannot_wait_longer_than_the_decorators_timeout() -> None:
    """The decorator's timeout_ms is the longest deadline, as the sidecar's is: a caller's
    longer one is cut to it."""
    hang = asyncio.Event()  # never set

    @carpool.batch(max_batch_size=2, max_wait_ms=1, timeout_ms=100)
    async def echo(items: list[str]) -> list[str]:
        await hang.wait()
        return items

    try:
        with pytest.raises(DeadlineExceeded):
            await asyncio.wait_for(echo("patient", timeout_ms=600_000), 10)
    finally:
        await echo.aclose()


def test_a_sync_function_serves_16_threads_through_blocking() -> None:
    threads: set[str] = set()
    registry = CollectorRegistry()

    @carpool.batch(max_batch_size=8, max_wait_ms=2, registry=registry)
    def square(items: list[int]) -> list[int]:
        threads.add(threading.current_thread().name)
        return [item * item for item in items]

    def client(worker: int) -> list[int]:
        return [square.blocking(worker * 100 + n) for n in range(50)]

    try:
        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(client, range(16)))
    finally:
        square.close()
    for worker, squares in enumerate(answers):
        assert squares == [(worker * 100 + n) ** 2 for n in range(50)]
    batches = sample(registry, "carpool_batch_size_count", model="square")
    assert batches < 16 * 50  # calls shared batches
    assert sample(registry, "carpool_requests_total", model="square", code="200") == 16 * 50
    assert threads and not threads & {threading.main_thread().name}


def test_importing_carpool_loads_no_torch_until_a_library_face_is_used() -> None:
    # `carpool operator` imports the package: the library faces must not drag torch in.
    code = (
        "import sys, carpool, carpool.cli; assert 'torch' not in sys.modules; "
        "carpool.batch; assert 'torch' not in sys.modules; "
        "import carpool_model_server; carpool_model_server.batch_inference; "
        "assert 'torch' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


async def test_a_call_that_never_returns_is_given_up_at_its_deadline() -> None:
    hang = asyncio.Event()  # never set: the first batch's call never returns

    @carpool.batch(max_batch_size=4, max_wait_ms=1, timeout_ms=200)
    async def echo(items: list[str]) -> list[str]:
        if "hang" in items:
            await hang.wait()
        return items

    try:
        with pytest.raises(DeadlineExceeded):
            await echo("hang")
        # The hung call held the only batch slot; past its deadline the slot is free again.
        assert await echo("next", timeout_ms=2000) == "next"
    finally:
        await echo.aclose()


async def test_a_call_that_ignores_its_cancellation_still_frees_the_slot() -> None:
    ended = False

    @carpool.batch(max_batch_size=4, max_wait_ms=1, timeout_ms=200)
    async def echo(items: list[str]) -> list[str]:
        while "stubborn" in items and not ended:
            # A function may swallow its cancellation; its batch's deadline must hold anyway.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.02)
        return items

    try:
        with pytest.raises(DeadlineExceeded):
            await echo("stubborn")
        assert await echo("next", timeout_ms=2000) == "next"
    finally:
        ended = True
        await echo.aclose()


def test_a_sync_call_that_never_returns_costs_its_thread_not_the_engine() -> None:
    release = threading.Event()

    @carpool.batch(max_batch_size=4, max_wait_ms=1, timeout_ms=200)
    def echo(items: list[str]) -> list[str]:
        if "hang" in items:
            release.wait(30)  # a thread cannot be stopped; the engine must not wait for it
        return items

    try:
        with pytest.raises(DeadlineExceeded):
            echo.blocking("hang")
        assert echo.blocking("next", timeout_ms=2000) == "next"
        assert echo.blocking("again", timeout_ms=2000) == "again"
    finally:
        release.set()
        echo.close()


def test_threads_left_running_past_their_deadline_are_bounded() -> None:
    release = threading.Event()

    @carpool.batch(max_batch_size=1, max_wait_ms=1, timeout_ms=100)
    def echo(items: list[str]) -> list[str]:
        if "hang" in items:
            release.wait(30)
        return items

    try:
        for _ in range(STUCK_THREADS):
            with pytest.raises(DeadlineExceeded):
                echo.blocking("hang")
        started = time.monotonic()
        with pytest.raises(Unavailable, match=f"{STUCK_THREADS} calls of echo still run"):
            echo.blocking("next", timeout_ms=5000)
        assert time.monotonic() - started < 1.0  # refused at once, not at its deadline
        release.set()  # the stuck calls return; their threads are free again
        assert _once_threads_free(lambda: echo.blocking("next", timeout_ms=2000)) == "next"
    finally:
        release.set()
        echo.close()


def _once_threads_free(call: Callable[[], str]) -> str:
    """`call`'s answer once the released threads have returned: on a busy machine they may
    not have yet when the test asks, and until then the call is refused (bounded)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return call()
        except Unavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (lambda items: None, "echo returned None, not a list of 32 results"),
        (lambda items: (item for item in items), "echo returned generator"),
        (lambda items: "x" * len(items), "echo returned str"),
        (lambda items: items[:3], "echo returned 3 results for 32 items"),
    ],
)
async def test_an_answer_that_is_not_one_result_per_item_fails_the_batch_once(
    answer: Any, words: str
) -> None:
    calls: list[int] = []

    @carpool.batch(max_batch_size=32, max_wait_ms=50)
    async def echo(items: list[int]) -> Any:
        calls.append(len(items))
        return answer(items)

    try:
        outcomes = await asyncio.gather(*(echo(i) for i in range(32)), return_exceptions=True)
    finally:
        await echo.aclose()
    assert calls == [32]  # one call, not halves: a wrong answer is the function's bug
    for outcome in outcomes:
        assert isinstance(outcome, SidecarError) and words in str(outcome), outcome


async def test_an_array_of_results_is_one_result_per_row() -> None:
    """What a model returns for a batch, unconverted: a numpy array (or a tensor), a row per
    item."""

    @carpool.batch(max_batch_size=8, max_wait_ms=20)
    async def embed(items: list[float]) -> Any:
        return np.array([[item, 2 * item] for item in items])

    try:
        rows = await asyncio.gather(*(embed(float(i)) for i in range(8)))
    finally:
        await embed.aclose()
    assert [row.tolist() for row in rows] == [[i, 2 * i] for i in range(8)]


BASE_EXCEPTIONS = """
import asyncio, sys, carpool

@carpool.batch(max_batch_size=8, max_wait_ms=20)
async def leave(items):
    if "exit" in items:
        sys.exit(3)
    if "interrupt" in items:
        raise KeyboardInterrupt
    return items

@carpool.batch(max_batch_size=8, max_wait_ms=20)
def leave_sync(items):
    if "exit" in items:
        sys.exit(4)
    return items

async def main():
    for function, poison in ((leave, "exit"), (leave, "interrupt"), (leave_sync, "exit")):
        outcomes = await asyncio.gather(function(poison), function("a"), return_exceptions=True)
        print(*(type(o).__name__ + ": " + str(o) for o in outcomes), sep=" | ")
        print("after:", await function("b"))
    await leave.aclose()
    await leave_sync.aclose()

asyncio.run(main())
"""


def test_a_function_that_raises_system_exit_fails_its_batch_and_the_engine_goes_on() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BASE_EXCEPTIONS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0::2] == [
        "FunctionAborted: leave raised SystemExit(3) | FunctionAborted: leave raised SystemExit(3)",
        "FunctionAborted: leave raised KeyboardInterrupt() | "
        "FunctionAborted: leave raised KeyboardInterrupt()",
        "FunctionAborted: leave_sync raised SystemExit(4) | "
        "FunctionAborted: leave_sync raised SystemExit(4)",
    ]
    assert lines[1::2] == ["after: b"] * 3
