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
_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[[], Any]]


class WorkerThread:
    """Runs the calls given to `call`, one at a time, in order, on one thread."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    async def call(self, function: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """`function(*args, **kwargs)` on the thread. Cancelled before it starts, it never
        runs; once started, it finishes and its result is dropped."""
        if self._closed:
            raise RuntimeError("the worker thread is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._jobs.put((loop, future, functools.partial(function, *args, **kwargs)))
        return await future

    def close(self) -> None:
        """Let the call in flight finish; calls not started yet are cancelled."""
        if not self._closed:
            self._closed = True
            self._jobs.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, future, function = job
            if self._closed:
                _answer(loop, future.cancel)
                continue
            if future.cancelled():  # read across threads: at worst a cancelled call runs
                continue
            try:
                result = function()
            except BaseException as error:  # the caller's to handle, as an executor does
                _answer(loop, _settle, future, None, error)
            else:
                _answer(loop, _settle, future, result, None)


def _answer(loop: asyncio.AbstractEventLoop, callback: Callable[..., Any], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
        loop.call_soon_threadsafe(callback, *args)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
