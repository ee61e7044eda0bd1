"""`carpool.batch` used as careless programs use it: a new event loop per `asyncio.run`, a
callable object, a function that raises CancelledError, `close()` called twice."""

from __future__ import annotations

import asyncio
import threading

import pytest

import carpool
from carpool.batching import DeadlineExceeded, FunctionAborted, Unavailable


def test_a_function_serves_each_asyncio_run_in_turn_and_then_threads() -> None:
    # A script (or a test suite) that calls asyncio.run twice: the first loop is closed, its
    # engine gone with it, and the next caller's loop starts another.
    @carpool.batch(max_batch_size=4, max_wait_ms=1)
    async def double(items: list[int]) -> list[int]:
        return [2 * item for item in items]

    async def calls(base: int) -> list[int]:
        return list(await asyncio.gather(*(double(base + n) for n in range(3))))

    assert asyncio.run(calls(0)) == [0, 2, 4]
    assert asyncio.run(calls(10)) == [20, 22, 24]
    assert double.blocking(7) == 14
    double.close()


async def test_an_object_with_an_async_call_is_awaited_and_named_by_its_class() -> None:
    class Doubler:
        async def __call__(self, items: list[int]) -> list[int]:
            await asyncio.sleep(0)
            return [2 * item for item in items]

    double = carpool.batch(max_batch_size=4, max_wait_ms=1)(Doubler())
    try:
        assert await asyncio.gather(double(1), double(2)) == [2, 4]
        assert double.name == "Doubler"
    finally:
        await double.aclose()


async def test_a_cancelled_error_the_function_raises_is_its_failure_not_a_stop() -> None:
    calls = 0

    @carpool.batch(max_batch_size=4, max_wait_ms=5)
    async def flaky(items: list[int]) -> list[int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            # What an awaited call that someone else cancelled raises into the function.
            raise asyncio.CancelledError()
        return items

    try:
        outcomes = await asyncio.gather(flaky(1), flaky(2), return_exceptions=True)
        assert [type(outcome) for outcome in outcomes] == [FunctionAborted] * 2
        assert "flaky raised CancelledError" in str(outcomes[0])
        assert await flaky(3) == 3  # the engine goes on
    finally:
        await flaky.aclose()


def test_close_twice_is_harmless() -> None:
    @carpool.batch(max_batch_size=2, max_wait_ms=1)
    def echo(items: list[int]) -> list[int]:
        return items

    assert echo.blocking(1) == 1
    echo.close()
    echo.close()
    with pytest.raises(carpool.batching.Unavailable):
        echo.blocking(2)


def test_aclose_in_a_later_asyncio_run_closes_what_an_earlier_one_left() -> None:
    # A program whose serving loop returned without closing the function closes it on
    # shutdown, in a loop of its own; the engine went with the first loop.
    @carpool.batch(max_batch_size=2, max_wait_ms=1)
    async def echo(items: list[int]) -> list[int]:
        return items

    async def call() -> int:
        return await echo(1)

    assert asyncio.run(call()) == 1
    asyncio.run(echo.aclose())
    with pytest.raises(carpool.batching.Unavailable):
        asyncio.run(call())


def test_a_blocking_call_ends_at_its_deadline_while_the_engines_loop_is_idle() -> None:
    # The engine started in a loop that `run_until_complete` ran and left open, idle: nothing
    # runs the call there, yet the calling thread hears DeadlineExceeded, not silence.
    @carpool.batch(max_batch_size=2, max_wait_ms=1, timeout_ms=100)
    async def echo(items: list[int]) -> list[int]:
        return items

    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(echo(1)) == 1
        outcomes: list[BaseException] = []

        def call() -> None:
            try:
                echo.blocking(2)
            except BaseException as error:
                outcomes.append(error)

        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        thread.join(10)
        assert not thread.is_alive(), "blocking() still waits, long past its deadline"
        assert [type(outcome) for outcome in outcomes] == [DeadlineExceeded]
        loop.run_until_complete(echo.aclose())  # the call given up ends there
    finally:
        loop.close()


def test_a_blocking_call_whose_engines_loop_ends_is_unavailable() -> None:
    """A thread's call waits on an engine that lives on an `asyncio.run` which then ends:
    the caller is told the function is unavailable (a carpool error it can catch), not
    handed concurrent.futures' CancelledError."""
    hanging = threading.Event()

    @carpool.batch(max_batch_size=1, max_wait_ms=1, timeout_ms=30_000)
    async def echo(items: list[str]) -> list[str]:
        if "hang" in items:
            hanging.set()
            await asyncio.sleep(60)
        return items

    outcome: list[BaseException | str] = []

    def call() -> None:
        try:
            outcome.append(echo.blocking("hang"))
        except BaseException as error:
            outcome.append(error)

    caller = threading.Thread(target=call)

    async def serve() -> None:
        assert await echo("warm") == "warm"  # the engine now lives on this loop
        caller.start()
        assert await asyncio.to_thread(hanging.wait, 10)
        # Returning ends the run: its loop's tasks, the thread's call among them, stop.

    asyncio.run(serve())
    caller.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], Unavailable), outcome
    echo.close()


def test_close_while_another_thread_makes_the_first_blocking_call_closes_its_loop() -> None:
    """close() from one thread while another's first blocking() call starts the function's
    own loop: the function ends up closed, not refused as if an async caller's loop held it."""

    @carpool.batch(max_batch_size=1, max_wait_ms=1)
    def echo(items: list[str]) -> list[str]:
        return items

    answers: list[str] = []
    real = echo._lock
    closing = threading.current_thread()

    class FirstCallInBetween:
        """The lock, with a whole blocking() call on another thread just before close()
        takes it: the interleaving a busy program may hit."""

        raced = False

        def __enter__(self) -> None:
            if threading.current_thread() is closing and not self.raced:
                self.raced = True
                caller = threading.Thread(target=lambda: answers.append(echo.blocking("hi")))
                caller.start()
                caller.join(10)
            real.acquire()

        def __exit__(self, *_: object) -> None:
            real.release()

    echo._lock = FirstCallInBetween()  # type: ignore[assignment]
    echo.close()
    assert answers == ["hi"]
    with pytest.raises(Unavailable):
        echo.blocking("late")
