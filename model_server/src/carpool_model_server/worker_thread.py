"""The model's one worker thread, and the hop to it from the event loop.

`run_in_executor` costs the model server a `concurrent.futures.Future` per call, its
condition's locks, and a second future chained to it; here a call is one queue entry and one
`call_soon_threadsafe` back (`bench/hop.py model-cpu` measures what a batch costs).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")
_Settled = Callable[["asyncio.Future[Any]"], None]
_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[[], Any], _Settled | None]


class WorkerThread:
    """Runs the calls given to `call`, one at a time, in order, on one thread."""

    def __init__(
        self,
        name: str,
        around: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> None:
        """`around()` is entered once on the thread, around every call it runs: a
        thread-local mode (such as torch's inference mode) set there once rather than per
        call."""
        self._around = around
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        # Calls given and not yet finished (run, skipped or cancelled), counted on the loop:
        # a caller cancelled while its call runs leaves the count up until the call ends.
        self._unfinished = 0
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    @property
    def idle(self) -> bool:
        """No call given to the thread is waiting or running (read on the loop's thread)."""
        return not self._unfinished

    async def call(self, function: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """`function(*args, **kwargs)` on the thread. Cancelled before it starts, it never
        runs; once started, it finishes and its result is dropped."""
        return await self.submit(functools.partial(function, *args, **kwargs))

    def submit(
        self,
        function: Callable[[], R],
        settled: Callable[[asyncio.Future[R]], None] | None = None,
    ) -> asyncio.Future[R]:
        """`call`'s future, for a caller that answers without a task; cancelling it is
        cancelling the call. `settled(future)` runs once the thread is done with the call
        (run, skipped or cancelled), in the loop's turn that hears it: a done callback
        would wait for the next turn."""
        if self._closed:
            raise RuntimeError("the worker thread is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._unfinished += 1
        self._jobs.put((loop, future, function, settled))
        return future

    def close(self) -> None:
        """Let the call in flight finish; calls not started yet are cancelled."""
        if not self._closed:
            self._closed = True
            self._jobs.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _serve(self) -> None:
        with self._around():
            self._run_jobs()

    def _run_jobs(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, future, function, settled = job
            result: Any = None
            error: BaseException | None = None
            if self._closed:
                error = asyncio.CancelledError()
            elif not future.cancelled():  # read across threads: at worst a cancelled call runs
                try:
                    result = function()
                except BaseException as raised:  # the caller's to handle, as an executor does
                    error = raised
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
                loop.call_soon_threadsafe(self._settle, future, result, error, settled)

    def _settle(
        self,
        future: asyncio.Future[Any],
        result: Any,
        error: BaseException | None,
        settled: _Settled | None,
    ) -> None:
        self._unfinished -= 1
        if future.cancelled():
            pass
        elif isinstance(error, asyncio.CancelledError):
            future.cancel()
        elif error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
        if settled is not None:
            settled(future)
