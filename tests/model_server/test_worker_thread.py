"""The model's worker thread: calls run in order on one thread, errors reach their caller,
a call cancelled before it starts never runs, and closing lets the running one finish."""

from __future__ import annotations

import asyncio
import threading

import pytest

from carpool_model_server.worker_thread import WorkerThread


async def test_calls_run_in_order_on_one_thread_and_errors_reach_their_caller() -> None:
    worker = WorkerThread("test-worker")
    ran: list[tuple[int, str]] = []

    def record(number: int) -> int:
        ran.append((number, threading.current_thread().name))
        if number == 2:
            raise ValueError("two")
        return number * 10

    try:
        results = await asyncio.gather(
            *(worker.call(record, n) for n in range(4)), return_exceptions=True
        )
    finally:
        worker.close()
    assert results[:2] == [0, 10] and results[3] == 30
    assert isinstance(results[2], ValueError)
    assert ran == [(n, "test-worker") for n in range(4)]


async def test_a_call_cancelled_before_it_starts_never_runs() -> None:
    worker = WorkerThread("test-worker")
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def block() -> None:
        started.set()
        release.wait(10)

    try:
        blocking = asyncio.ensure_future(worker.call(block))
        await asyncio.to_thread(started.wait, 10)
        waiting = asyncio.ensure_future(worker.call(ran.append, "cancelled"))
        await asyncio.sleep(0)
        waiting.cancel()
        release.set()
        await blocking
        assert await worker.call(ran.append, "after") is None
    finally:
        worker.close()
    assert ran == ["after"]
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_closing_lets_the_running_call_finish_and_cancels_the_queued_ones() -> None:
    worker = WorkerThread("test-worker")
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def block() -> str:
        started.set()
        release.wait(10)
        return "finished"

    running = asyncio.ensure_future(worker.call(block))
    await asyncio.to_thread(started.wait, 10)
    queued = asyncio.ensure_future(worker.call(ran.append, "queued"))
    await asyncio.sleep(0)
    closing = asyncio.ensure_future(asyncio.to_thread(worker.close))
    for _ in range(1000):  # until close() has begun: it then waits for the running call
        if worker._closed:
            break
        await asyncio.sleep(0.01)
    release.set()
    await closing
    assert await running == "finished"
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert ran == []
    with pytest.raises(RuntimeError, match="closed"):
        await worker.call(ran.append, "late")


async def test_settled_hears_each_call_once_the_thread_is_done_with_it() -> None:
    """A call cancelled while it waits is heard of when the thread reaches it (and skips
    it), not when it is cancelled: until then the worker is not idle."""
    worker = WorkerThread("test-worker")
    started, release, both = threading.Event(), threading.Event(), asyncio.Event()
    heard: list[tuple[object, bool, bool]] = []

    def hear(future: asyncio.Future[str]) -> None:
        outcome = "cancelled" if future.cancelled() else future.result()
        heard.append((outcome, worker.idle, future.done()))
        if len(heard) == 2:
            both.set()

    def block() -> str:
        started.set()
        release.wait(10)
        return "ran"

    try:
        worker.submit(block, hear)
        await asyncio.to_thread(started.wait, 10)
        worker.submit(lambda: "never", hear).cancel()
        await asyncio.sleep(0.05)
        assert heard == [] and not worker.idle
        release.set()
        await asyncio.wait_for(both.wait(), 10)
    finally:
        worker.close()
    assert heard == [("ran", False, True), ("cancelled", True, True)]
