"""The HTTP runner of a process that serves the sidecar's routes, and opening its ports."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable
from typing import TypeVar

from aiohttp import web

from carpool_sidecar.config import SidecarConfig
from carpool_sidecar.hot_routes import serve_hot_routes

# After the drain every accepted request has its answer; this only bounds writing them out.
SHUTDOWN_TIMEOUT_S = 5.0
T = TypeVar("T")


class CannotListen(Exception):
    """A port the sidecar was given is taken or not allowed: it cannot start."""


async def listening(opening: Awaitable[T], address: str) -> T:
    try:
        return await opening
    except OSError as error:
        raise CannotListen(f"cannot listen on {address}: {error.strerror or error}") from error


async def signalled() -> None:
    """Return at the first SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()


async def app_runner(app: web.Application, config: SidecarConfig) -> web.AppRunner:
    """The runner of `app`, set up, its v2 infer route served ahead of the router."""
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        # After an early answer (413, 408) the rest of a body is read and dropped for this
        # long before the connection closes, so a client still sending sees the answer, not
        # a reset; a stalled body holds its connection no longer than its timeout.
        lingering_time=config.body_timeout_s,
    )
    await runner.setup()
    serve_hot_routes(runner)
    return runner
