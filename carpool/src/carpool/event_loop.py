"""The event loop carpool's servers run on: uvloop where it is installed, else asyncio's.

uvloop's transports and timers are C; it measured a little cheaper per request than
asyncio's loop (docs/benchmarks.md, "The sidecar's per-request cost").
`CARPOOL_EVENT_LOOP=asyncio` picks the standard loop anyway, e.g. to rule uvloop out while
chasing a bug.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar, get_args

T = TypeVar("T")
EventLoop = Literal["auto", "uvloop", "asyncio"]
EVENT_LOOPS: tuple[EventLoop, ...] = get_args(EventLoop)
ENV = "CARPOOL_EVENT_LOOP"


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """A new-loop function for `choice`; None means asyncio's default loop."""
    if choice not in EVENT_LOOPS:
        raise ValueError(f"{ENV}={choice!r}: expected one of {', '.join(EVENT_LOOPS)}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the loop that `CARPOOL_EVENT_LOOP` (default auto) picks."""
    with asyncio.Runner(loop_factory=loop_factory(os.environ.get(ENV, "auto"))) as runner:
        return runner.run(main)
