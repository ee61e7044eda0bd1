"""A mailbox that holds only the newest value put in it, for values that each supersede the
ones before: a reader slower than its writer finds one value waiting, not one per write.

The token loop's outputs of a sequence are such values (each carries all its tokens so far):
queued, a reader held up by a slow sidecar held one output per step, tokens quadratic in
the answer's length. A final value (the sequence's end, or its error) is never replaced:
nothing that follows may overtake it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Latest(Generic[T]):
    """The newest value not taken yet; `put` and `get` on one event loop's thread."""

    def __init__(self, final: Callable[[T], bool]) -> None:
        self._final = final
        self._box: deque[T] = deque(maxlen=1)  # appending replaces the value there
        self._waiter: asyncio.Future[None] | None = None

    def put(self, value: T) -> None:
        """Leave `value` in place of the one not taken yet, unless that one is final."""
        if self._box and self._final(self._box[0]):
            return
        self._box.append(value)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def get(self) -> T:
        """The newest value, once there is one not taken yet."""
        while not self._box:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._box.popleft()
