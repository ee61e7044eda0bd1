"""`carpool.batch`: the sidecar's batching engine around a function, in process.

    @carpool.batch(max_batch_size=32, max_wait_ms=5)
    async def embed(texts: list[str]) -> list[list[float]]: ...

    vector = await embed("one text")          # from async code
    vector = embed.blocking("one text")       # from any plain thread

Each call submits one item to `carpool.engine.batcher.Batcher`, the engine the sidecar runs,
with its adaptive dispatch, priorities, deadlines, queue bound and metrics; the function is
its `send`. A sync function runs on a worker thread. When the function raises, the batch is
split in halves and retried, so only the items that fail alone get the exception (the
function must tolerate seeing the other items again). An item can also fail alone by having
its slot in the returned list hold an Exception.

The function answers a list, or an array (numpy, torch) a row per item. Its own bugs fail
the whole batch at once, never split: an answer that is not one result per item (None, a
generator, a list of the wrong length), and a BaseException it raises (SystemExit,
KeyboardInterrupt, a CancelledError not meant for the batch), which must not end the event
loop. A batch ends at its callers' latest deadline: a coroutine still running is cancelled
(and not waited for); a thread cannot be, so it is left to finish on its own while new
batches get fresh threads, at most STUCK_THREADS of them left running at once. The engine
runs on one event loop at a time: a new one once the last was closed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import math
import threading
from collections.abc import Awaitable, Callable, Hashable, Iterable, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from prometheus_client import CollectorRegistry

from carpool.contract.batching import IN_PROCESS_DEFAULTS, KNOBS
from carpool.engine import bisection
from carpool.engine.batcher import Batcher
from carpool.engine.errors import (
    BadModelResponse,
    DeadlineExceeded,
    QueueFull,
    SidecarError,
    Unavailable,
)
from carpool.engine.execution import Answer
from carpool.engine.metrics import IN_PROCESS, SidecarMetrics
from carpool.engine.pending import BatchKey
from carpool.engine.settings import BatchingSettings
from carpool.loop_thread import LoopThread

__all__ = [
    "Batched",
    "DeadlineExceeded",
    "FunctionAborted",
    "QueueFull",
    "SidecarError",
    "Unavailable",
    "batch",
]

ItemT = TypeVar("ItemT")
ResultT = TypeVar("ResultT")
BatchFunction = Callable[[list[ItemT]], Awaitable[Sequence[Any]] | Sequence[Any]]
# Seconds a closing batcher waits for queued calls to be answered.
CLOSE_GRACE_S = 30.0
# Calls of a sync function still running past their batch's deadline: beyond this many,
# batches fail at once rather than start yet another thread.
STUCK_THREADS = 8
# How long past its deadline a `blocking` caller waits for the loop's own answer to it.
BLOCKING_GRACE_S = 1.0
_OK = 200


class FunctionAborted(SidecarError):
    """The function raised a BaseException that is not an Exception (SystemExit, ...)."""


@dataclass(frozen=True, slots=True)
class _Sender(Generic[ItemT, ResultT]):
    """The engine's BatchSender: the wrapped function instead of the model server."""

    name: str
    answer: Callable[[Sequence[ItemT]], Awaitable[list[ResultT | Exception]]]

    async def send(self, items: Sequence[ItemT], timeout_s: float) -> Answer[ResultT | Exception]:
        # No hop and no queue of its own: the round trip is the function's time, up to the
        # batch's deadline (its callers have their answer by then). Not waited for past it,
        # even if it ignores its cancellation: the batch's slot is free again at once.
        call = asyncio.ensure_future(self.answer(items))
        try:
            done, _ = await asyncio.wait({call}, timeout=timeout_s)
        except asyncio.CancelledError:
            call.cancel()
            raise
        if not done:
            call.cancel()
            call.add_done_callback(_forget)
            raise DeadlineExceeded(
                f"{self.name} did not answer a batch of {len(items)} within "
                f"{1000 * timeout_s:.0f} ms"
            )
        return call.result(), None


def _forget(call: asyncio.Future[Any]) -> None:
    """Take the outcome of a call given up at its deadline, so that it is not reported."""
    if not call.cancelled():
        call.exception()


class Batched(Generic[ItemT, ResultT]):
    """A batch function wrapped for single-item calls; see the module doc."""

    def __init__(
        self,
        function: Callable[[list[ItemT]], Any],
        settings: BatchingSettings,
        registry: CollectorRegistry,
        name: str,
        group_by: Callable[[ItemT], Hashable] | None,
    ) -> None:
        functools.update_wrapper(self, function)
        self._function = function
        self.name = name
        # A callable object with an `async def __call__` is a coroutine function too.
        self._is_async = inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(
            type(function).__call__
        )
        self._settings = settings
        self.metrics = SidecarMetrics(registry, name)
        self._group_by = group_by
        # An item's outcome is its result, or the exception it failed with.
        self._batcher: Batcher[ItemT, ResultT | Exception] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the engine runs on
        self._dispatcher: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        # Calls left running on their threads past their deadline.
        self._stuck: list[Future[Any]] = []
        self._own_loop: LoopThread | None = None
        self._lock = threading.Lock()
        self._closed = False

    async def __call__(
        self, item: ItemT, *, priority: int = 0, timeout_ms: float | None = None
    ) -> ResultT:
        """The function's result for `item`, computed in a batch with other callers' items.

        Raises what the function raised for this item, QueueFull when the queue is at its
        bound, DeadlineExceeded after `timeout_ms` (default and at most the decorator's;
        ValueError unless finite), Unavailable once closed. Cancelling the caller drops the
        item if its batch has not started.
        """
        timeout_s = self._timeout_s(timeout_ms)
        batcher = self._engine()
        loop = asyncio.get_running_loop()
        started = loop.time()
        key = BatchKey(None if self._group_by is None else self._group_by(item))
        with self.metrics.answering(IN_PROCESS) as answer:
            (outcome,) = await batcher.submit([item], key, started + timeout_s, priority=priority)
            if isinstance(outcome, Exception):
                raise outcome  # counted 500: the function failed on this item
            answer.status = _OK
            return outcome

    def blocking(
        self, item: ItemT, *, priority: int = 0, timeout_ms: float | None = None
    ) -> ResultT:
        """`__call__` for plain threads: blocks this thread until the item's answer.

        The engine runs on the event loop of the first async caller, or else on a loop
        thread of its own; never call this from that loop's thread.
        """
        with self._lock:
            if self._closed:
                raise Unavailable("this batch function is closed")
            self._forget_a_closed_loop()
            if self._loop is None:
                self._own_loop = LoopThread(f"carpool-batch-{self.name}")
                self._loop = self._own_loop.loop
            loop = self._loop
        if _running_loop() is loop:
            raise RuntimeError("blocking() called from the batching loop's own thread")
        timeout_s = self._timeout_s(timeout_ms)
        future = asyncio.run_coroutine_threadsafe(
            self(item, priority=priority, timeout_ms=timeout_ms), loop
        )
        try:
            # Bounded: a loop that is not running (left open by `run_until_complete`, or
            # closing) never answers.
            return future.result(timeout_s + BLOCKING_GRACE_S)
        except TimeoutError:
            future.cancel()
            raise DeadlineExceeded(
                f"{self.name}'s event loop did not answer within {1000 * timeout_s:.0f} ms"
            ) from None
        except CancelledError:
            # The engine's loop ended (its `asyncio.run` returned) with this call in flight.
            raise Unavailable(f"{self.name}'s event loop stopped before it answered") from None
        except BaseException:
            future.cancel()  # this thread was interrupted: the item is no longer wanted
            raise

    async def aclose(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """Answer what is queued (up to `grace_s`), then stop the engine; call on shutdown."""
        with self._lock:
            self._closed = True
            self._forget_a_closed_loop()  # nothing is left to answer there
        if self._batcher is not None and self._dispatcher is not None:
            await self._batcher.drain(grace_s)
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def close(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """`aclose` for threaded programs that used only `blocking`, or whose engine's
        `asyncio.run` has returned (nothing is left to answer there)."""
        with self._lock:  # a first blocking() call on another thread may be starting a loop
            self._forget_a_closed_loop()
            own = self._own_loop
            if own is None:
                if self._loop is not None:
                    raise RuntimeError("the engine runs on an async caller's loop: await aclose()")
                self._closed = True
                return
        if own.loop.is_closed():
            return  # closed before
        own.submit(self.aclose(grace_s)).result()
        own.stop()

    def _timeout_s(self, timeout_ms: float | None) -> float:
        """A call's deadline in seconds: the decorator's timeout_ms is the default and the
        longest, as the sidecar's is."""
        if timeout_ms is not None and not math.isfinite(timeout_ms):
            # No deadline at all: a call that never returns would hold its caller forever.
            raise ValueError(f"timeout_ms must be a finite number, got {timeout_ms!r}")
        longest = self._settings.timeout_ms
        return (longest if timeout_ms is None else min(timeout_ms, longest)) / 1000

    def _engine(self) -> Batcher[ItemT, ResultT | Exception]:
        """The engine, started on the first caller's loop; every later caller must share it."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._closed:
                raise Unavailable("this batch function is closed")
            self._forget_a_closed_loop()
            if self._loop is not None and self._loop is not loop:
                raise RuntimeError(
                    "a carpool.batch function serves one event loop; use blocking() from threads"
                )
            if self._batcher is None:
                self._loop = loop
                sender = _Sender(self.name, self._answer)
                self._batcher = Batcher(self._settings, sender, self.metrics)
                self._dispatcher = loop.create_task(self._batcher.run())
                if not self._is_async:
                    self._executor = self._new_executor()
            return self._batcher

    def _forget_a_closed_loop(self) -> None:
        """Drop an engine whose loop was closed (an `asyncio.run` that returned): its task
        ended with the loop, so the next caller's loop starts a new one. Under the lock."""
        if self._loop is None or not self._loop.is_closed():
            return
        self._loop = self._batcher = self._dispatcher = None
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    def _new_executor(self) -> ThreadPoolExecutor:
        workers = self._settings.max_inflight_batches
        return ThreadPoolExecutor(workers, f"carpool-{self.name}")

    async def _answer(self, items: Sequence[ItemT]) -> list[ResultT | Exception]:
        """Each item's outcome: run the function on the batch, and on its halves if it raises."""
        plan: bisection.Plan[ItemT, ResultT | Exception] = bisection.isolate(
            items,
            failed=lambda error: error,
            # A wrong answer or an exit is a bug of the function: halves would not mend it.
            splits=lambda error: not isinstance(error, BadModelResponse | FunctionAborted),
        )
        return await bisection.run_async(plan, self._attempt)

    async def _attempt(self, items: Sequence[ItemT]) -> bisection.Outcome[ResultT | Exception]:
        try:
            answer = await self._run(list(items))
        except Exception as error:
            return error
        except BaseException as error:
            task = asyncio.current_task()
            if isinstance(error, asyncio.CancelledError) and task and task.cancelling():
                raise  # the batch's deadline, or the engine stopping
            # Or the function's own: a CancelledError of something it awaited, an exit.
            aborted = FunctionAborted(f"{self.name} raised {error!r}")
            aborted.__cause__ = error
            return aborted
        results = _rows(answer)
        if results is None:
            kind = "None" if answer is None else type(answer).__name__
            return BadModelResponse(
                f"{self.name} returned {kind}, not a list of {len(items)} results"
            )
        if len(results) != len(items):
            return BadModelResponse(
                f"{self.name} returned {len(results)} results for {len(items)} items"
            )
        # An Exception in the list is that item's failure.
        return results

    async def _run(self, items: list[ItemT]) -> object:
        if self._is_async:
            return await self._function(items)
        self._stuck = [call for call in self._stuck if not call.done()]
        if len(self._stuck) >= STUCK_THREADS:
            raise Unavailable(
                f"{len(self._stuck)} calls of {self.name} still run past their deadline; "
                "no more start until one returns"
            )
        assert self._executor is not None
        call = self._executor.submit(self._function, items)
        try:
            return await asyncio.wrap_future(call)
        except asyncio.CancelledError:
            if not call.cancel() and not call.done():
                # Running past the deadline on its thread, which cannot be stopped: later
                # batches get threads of their own; the old ones end when their calls do.
                self._stuck.append(call)
                stuck, self._executor = self._executor, self._new_executor()
                stuck.shutdown(wait=False)
            raise


def _rows(answer: object) -> Sequence[Any] | None:
    """The function's answer as one result per item: a list (any sequence but a string), or
    an array (numpy, torch) a row each; None when it is neither."""
    if isinstance(answer, Sequence) and not isinstance(answer, str | bytes):
        return answer
    if hasattr(answer, "__array__") and getattr(answer, "ndim", 0) >= 1:
        return list(cast(Iterable[Any], answer))
    return None


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def batch(
    *,
    registry: CollectorRegistry | None = None,
    name: str | None = None,
    group_by: Callable[[Any], Hashable] | None = None,
    **knobs: Any,
) -> Callable[[Callable[[list[ItemT]], Any]], Batched[ItemT, Any]]:
    """Batch single-item calls of a function from a list of items to a list of results.

    `knobs` are the sidecar's batching knobs by attribute name (`max_batch_size=32`,
    `max_wait_ms=5`, ...: every field of `carpool.contract.batching.Batching`), with the
    decorator's own defaults where they differ (`IN_PROCESS_DEFAULTS`). `registry` receives
    the sidecar's metrics labelled `model=name` (default: the function's name); `group_by`
    keys items that may share a batch (default: all may).
    """
    unknown = sorted(set(knobs) - {knob.attribute for knob in KNOBS})
    if unknown:
        known = ", ".join(knob.attribute for knob in KNOBS)
        raise TypeError(f"batch() got unknown knobs {unknown}; the knobs are {known}")
    settings = BatchingSettings(**{**dataclasses.asdict(IN_PROCESS_DEFAULTS), **knobs})

    def wrap(function: Callable[[list[ItemT]], Any]) -> Batched[ItemT, Any]:
        return Batched(
            function,
            settings,
            registry if registry is not None else CollectorRegistry(),
            name or str(getattr(function, "__name__", type(function).__name__)),
            group_by,
        )

    return wrap
