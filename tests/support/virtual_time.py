"""An event loop on a virtual clock, for tests of what code decides when, free of the host's
timers.

    @on_virtual_time
    async def test_...() -> None:   # its clock: asyncio.get_running_loop().time()

The clock stands still while anything is ready to run; when nothing is, it jumps to the next
timer. So code takes no time, and a sleep, a timeout or a stand-in model's batch takes
exactly what it says however loaded the machine is: a test can hold timing decisions to the
microsecond, and runs as fast as the code does; `spend` stands for code that takes a while.
Only for code that waits on nothing but timers and itself: the clock does not wait for
sockets or threads (they are still polled).
"""

from __future__ import annotations

import asyncio
import functools
import selectors
import time
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec

P = ParamSpec("P")
# All that a float's rounding leaves between two times on virtual time that are the same.
EXACT_S = 1e-9

# Where the clock starts: far from zero, as a monotonic clock is, so that no code meets a
# time of 0 or a deadline in the past by starting there.
START_S = 1000.0


class _Skipping(selectors.DefaultSelector):
    """Polls, and where the loop would block until its next timer, moves the clock to it."""

    def __init__(self) -> None:
        super().__init__()
        self.now = START_S

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer: only another thread can wake the loop, in real time
            return super().select(None)
        self.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._skipping = _Skipping()
        super().__init__(self._skipping)

    def time(self) -> float:
        return self._skipping.now

    def spend(self, seconds: float) -> None:
        self._skipping.now += seconds


class StillClockLoop(asyncio.SelectorEventLoop):
    """A loop whose clock does not move: uvloop's reads the same for a whole millisecond, in
    which a fast call is over. Code timed on the loop's clock reads 0 here. It stands at
    the time it was made, so deadlines on it and `time.monotonic` still agree."""

    def __init__(self) -> None:
        super().__init__()
        self._now = time.monotonic()

    def time(self) -> float:
        return self._now


def spend(seconds: float) -> None:
    """The code running now takes `seconds`, as a busy turn of the loop does: the clock moves
    on."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop), "not on virtual time"
    loop.spend(seconds)


def on_virtual_time(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    """An async test run on a new loop on virtual time: to pytest (and pytest-asyncio), a
    plain one."""

    @functools.wraps(test)
    def on_its_loop(*args: P.args, **kwargs: P.kwargs) -> None:
        with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
            runner.run(test(*args, **kwargs))

    return on_its_loop
