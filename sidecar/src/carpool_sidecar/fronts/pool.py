"""The front processes, each on its own listening socket; one that dies is started again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import socket
import sys
from collections.abc import AsyncIterator

from carpool_sidecar.config import SidecarConfig
from carpool_sidecar.fronts import link
from carpool_sidecar.fronts.hub import Hub

log = logging.getLogger(__name__)

# A front that dies is started again after this, doubled for each death in a row up to
# RESTART_MAX_S, as a kubelet backs off a crashing container; one that lived a while
# (LIVED_S) starts the count again.
RESTART_S = 0.25
RESTART_MAX_S = 10.0
LIVED_S = 30.0


def listener(host: str, port: int) -> socket.socket:
    """A listening socket that shares `port` with the other fronts' (SO_REUSEPORT): the
    kernel spreads new connections over them evenly."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


class FrontPool:
    """Runs one front per listening socket while the block of `running` lasts."""

    def __init__(self, config: SidecarConfig, hub: Hub, listeners: list[socket.socket]) -> None:
        self._config = config
        self._hub = hub
        self._listeners = listeners
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self.pids: dict[int, int] = {}  # slot: pid of the front running there

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """On leaving, fronts still running are killed."""
        tasks = self._tasks = [
            asyncio.create_task(self._tend(slot)) for slot in range(len(self._listeners))
        ]
        try:
            yield
        finally:
            self._stopping = True
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        """From now on a front that exits is not started again: the sidecar is stopping."""
        self._stopping = True

    async def stopped(self, timeout_s: float) -> None:
        """Wait for the fronts to exit of themselves (after CLOSE), at most `timeout_s`."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=timeout_s)

    async def _tend(self, slot: int) -> None:
        delay = RESTART_S
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            code = await self._run(slot)
            if self._stopping:
                return
            log.error("front process %d exited with %s; starting another", slot, code)
            delay = RESTART_S if loop.time() - started > LIVED_S else delay
            await asyncio.sleep(delay)
            delay = min(2 * delay, RESTART_MAX_S)

    async def _run(self, slot: int) -> int:
        """Start the front of `slot` and serve its link until it exits: its exit code."""
        listening = self._listeners[slot]
        ours, theirs = socket.socketpair()
        with theirs:
            fds = (theirs.fileno(), listening.fileno())
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "carpool_sidecar.fronts.front", *map(str, fds), pass_fds=fds
            )
        self.pids[slot] = process.pid
        channel = await link.connect(ours)
        channel.send(link.CONFIG, 0, pickle.dumps(self._config))
        serving = asyncio.create_task(self._hub.serve(channel))
        try:
            return await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            del self.pids[slot]
            channel.close()
            await asyncio.gather(serving, return_exceptions=True)
