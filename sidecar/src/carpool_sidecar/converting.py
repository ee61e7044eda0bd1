"""Converting large request bodies off the event loop, one at a time.

Converting a body makes a Python object per element of its JSON or BYTES data: 60 MB of
them take seconds, and on the event loop every other caller, health probes included, would
wait that long. A body above INLINE_BYTES is converted in one worker thread instead, which
hands the interpreter back to the loop every few milliseconds (`sys.getswitchinterval`); one
conversion runs at a time, so at most one holds its transient objects, and bodies waiting for
it count in --max-reading-bytes with those being read. Smaller bodies convert in place, where
the hop to a thread would cost more than the work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from carpool_sidecar.reading import ReadingBudget

# A body this size converts in a few milliseconds.
INLINE_BYTES = 1 << 20

T = TypeVar("T")


class Converter:
    def __init__(self, budget: ReadingBudget) -> None:
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="carpool-convert")
        # Bodies waiting for the worker count with those being read: the line is bounded.
        self._budget = budget

    async def run(self, size: int, convert: Callable[[], T]) -> T:
        """`convert()` for a body of `size` bytes; Unavailable (503, Retry-After) when the
        bodies being read or converted already hold the budget. A caller who leaves while
        its conversion waits for the worker takes it out of the line; one already running
        runs out."""
        if size <= INLINE_BYTES:
            return convert()
        self._budget.check()
        self._budget.held += size
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker, convert)
        finally:
            self._budget.held -= size

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
