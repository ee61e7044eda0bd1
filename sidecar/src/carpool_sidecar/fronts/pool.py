"""The front processes, each on its own listening socket; one that dies is started again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import socket
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

from carpool_sidecar.config import SidecarConfig
from carpool_sidecar.fronts import link
from carpool_sidecar.fronts.hub import Hub
from carpool_sidecar.supervision import supervised

log = logging.getLogger(__name__)

# A front that dies is started again after this, doubled for each death in a row up to
# RESTART_MAX_S, as a kubelet backs off a crashing container; one that lived a while
# (LIVED_S) starts the count again.
RESTART_S = 0.25
RESTART_MAX_S = 10.0
LIVED_S = 30.0
# How long a front may outlive its link: a front exits as soon as its link closes.
LINK_GONE_S = 1.0


def listeners(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` listening sockets that share `port` (SO_REUSEPORT): the kernel spreads new
    connections evenly over them. A port that another process listens on is refused first,
    as a one-process sidecar refuses it, even where that process shares it too (another
    sidecar's fronts): joining its group would split the callers between the two."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    with _socket(family, kind, proto) as probe:
        probe.bind(address)
    bound: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = _socket(family, kind, proto)
            bound.append(sock)
            _share(sock, address)
            sock.listen(128)
    except OSError:
        for sock in bound:
            sock.close()
        raise
    return bound


def _socket(family: int, kind: int, proto: int) -> socket.socket:
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return sock


def _share(sock: socket.socket, address: tuple[Any, ...]) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)


class FrontPool:
    """Runs one front per listening socket while the block of `running` lasts."""

    def __init__(
        self,
        config: SidecarConfig,
        hub: Hub,
        listeners: list[socket.socket],
        on_death: Callable[[str], None],
    ) -> None:
        """`on_death`: told when a front can no longer be started (the sidecar is broken).
        The pool closes the sockets when it stops."""
        self._config = config
        self._hub = hub
        self._sockets: list[socket.socket | None] = list(listeners)
        first = listeners[0]
        self._address = (first.family, first.type, first.proto, first.getsockname())
        self._on_death = on_death
        self._stopping = asyncio.Event()
        self._none_running = asyncio.Event()
        self.pids: dict[int, int] = {}  # slot: pid of the front running there

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """On leaving, fronts still running are killed."""
        tending = {f"front-{slot}": self._tend(slot) for slot in range(len(self._sockets))}
        async with supervised(tending, self._on_death):
            yield
        self._stopping.set()

    def stop(self) -> None:
        """From now on a front that exits is not started again: the sidecar is stopping.
        The fronts' own copies alone keep the port, so a front's socket leaves the port's
        group when the front closes it (or dies), rather than taking connections nobody
        accepts."""
        self._stopping.set()
        for sock in self._sockets:
            if sock is not None:
                sock.close()

    async def stopped(self, timeout_s: float) -> None:
        """Wait for the fronts to exit of themselves (after CLOSE), at most `timeout_s`."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._none_running.wait()

    async def _tend(self, slot: int) -> None:
        """Runs until cancelled: the front of `slot`, started again whenever it exits."""
        delay = RESTART_S
        loop = asyncio.get_running_loop()
        # Not after a SIGTERM, one in the restart's delay too: the socket is closed by then.
        while not self._stopping.is_set():
            sock = self._sockets[slot]
            if sock is None:
                # Bound, not listening: it joins the port's group as its front starts serving
                # (asyncio listens on it), not while the front starts.
                family, kind, proto, address = self._address
                sock = self._sockets[slot] = _socket(family, kind, proto)
                _share(sock, address)
            started = loop.time()
            code = await self._run(slot, sock)
            if self._stopping.is_set():
                break
            if self._others_listen(slot):
                # The dead front's socket leaves the port's group at once: new connections go
                # to the live fronts, rather than wait in its backlog for the restart (those
                # already waiting there are reset, as when a one-process sidecar dies). The
                # last one stays: its connections wait for the restart, not refused.
                sock.close()
                self._sockets[slot] = None
            delay = RESTART_S if loop.time() - started > LIVED_S else delay
            log.error(
                "front process %d exited with %s; starting another in %.2f s", slot, code, delay
            )
            await asyncio.sleep(delay)
            delay = min(2 * delay, RESTART_MAX_S)
        await asyncio.Future()  # parked until the pool's block ends

    def _others_listen(self, slot: int) -> bool:
        """Whether the socket of a slot other than `slot` is in the port's group."""
        return any(
            sock is not None and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            for other, sock in enumerate(self._sockets)
            if other != slot
        )

    async def _run(self, slot: int, listening: socket.socket) -> int:
        """Start the front of `slot` on `listening` and serve its link until it exits: its
        exit code."""
        ours, theirs = socket.socketpair()
        with theirs:
            fds = (theirs.fileno(), listening.fileno())
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "carpool_sidecar.fronts.front", *map(str, fds), pass_fds=fds
            )
        self.pids[slot] = process.pid
        self._none_running.clear()
        log.info("front process %d started (pid %d)", slot, process.pid)
        channel: link.Link | None = None
        serving: asyncio.Task[None] | None = None
        try:
            channel = await link.connect(ours)
            channel.send(link.CONFIG, 0, pickle.dumps(self._config))
            serving = asyncio.create_task(self._hub.serve(channel))
            exited = asyncio.create_task(process.wait())
            await asyncio.wait((serving, exited), return_when=asyncio.FIRST_COMPLETED)
            # The link ends as its front exits; one that ends first leaves the front useless.
            await asyncio.wait((exited,), timeout=LINK_GONE_S)
            if not exited.done():
                log.error("front process %d lost its link; stopping it", slot)
                exited.cancel()
            return -1 if process.returncode is None else process.returncode
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            del self.pids[slot]
            if not self.pids:
                self._none_running.set()
            if channel is None:
                ours.close()
            else:
                channel.close()
            if serving is not None:
                await asyncio.gather(serving, return_exceptions=True)
