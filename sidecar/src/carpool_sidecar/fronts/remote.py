"""A front process's batcher: its requests' items go over the link to the batching process."""

from __future__ import annotations

import asyncio
import itertools
import pickle
from collections.abc import Callable, Sequence

import msgpack
from prometheus_client import CollectorRegistry

from carpool.contract import frames, wire
from carpool.contract.wire import Item, ItemResult
from carpool.engine.bounds import RequestBounds
from carpool.engine.errors import Unavailable
from carpool.engine.pending import BatchKey
from carpool.engine.settings import BatchingSettings
from carpool_sidecar.fronts import link
from carpool_sidecar.fronts.link import Link, State
from carpool_sidecar.generation import Ending

SCRAPE_TIMEOUT_S = 5.0


class RemoteBatcher:
    """`ItemBatcher` over the link; its reader (`run`) also takes the batching process's
    state and its requests for this front's metrics and for closing its port."""

    def __init__(
        self,
        channel: Link,
        settings: BatchingSettings,
        registry: CollectorRegistry,
        on_state: Callable[[State], None],
    ) -> None:
        self._link = channel
        self._registry = registry
        self._on_state = on_state
        self._settings = settings
        self._draining = False
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future[bytes]] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        # The drain's grace (seconds) once the batching process says to close; None if it
        # is gone.
        self.close_asked: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()

    @property
    def settings(self) -> BatchingSettings:
        return self._settings

    @property
    def bounds(self) -> RequestBounds:
        return RequestBounds(self._settings.max_queue_items, self._settings.max_queue_bytes)

    @property
    def draining(self) -> bool:
        return self._draining

    async def submit(
        self,
        items: Sequence[Item],
        key: BatchKey,
        deadline: float,
        *,
        priority: int = 0,
        lengths: Sequence[int] | None = None,
        nbytes: int = 0,
        arrived_at: float | None = None,
    ) -> list[ItemResult]:
        submit = link.Submit(
            items[:], key, deadline, priority,
            None if lengths is None else list(lengths), nbytes, arrived_at,
        )  # fmt: skip
        payload = await self._ask(link.SUBMIT, link.encode_submit(submit))
        return wire.decode_response(payload)

    async def scrape(self) -> bytes:
        """The whole sidecar's metrics, as the batching process gathers them."""
        async with asyncio.timeout(SCRAPE_TIMEOUT_S):
            return await self._ask(link.SCRAPE)

    async def idle(self) -> None:
        """Once every request sent is answered."""
        await self._idle.wait()

    def generated(self, arrived_at: float, ending: Ending) -> None:
        """A generate answer came whole: the batching process keeps the generation metrics."""
        self._link.send(link.GENERATED, 0, pickle.dumps((arrived_at, ending)))

    def closed(self) -> None:
        """This front stopped accepting."""
        self._link.send(link.CLOSED, 0)

    async def _ask(self, code: int, payload: bytes = b"") -> bytes:
        frame_id = next(self._ids) % frames.ID_MODULUS
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting[frame_id] = future
        self._idle.clear()
        self._link.send(code, frame_id, payload)
        try:
            return await future
        finally:
            if self._waiting.pop(frame_id, None) is not None:
                # Given up on (the caller left): its items need not reach a batch.
                self._link.send(link.CANCEL, frame_id)
            if not self._waiting:
                self._idle.set()

    async def run(self) -> None:
        """Read the link until the batching process closes it; then fail what waits."""
        try:
            async for code, frame_id, payload in self._link.frames():
                self._take(code, frame_id, payload)
        finally:
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(Unavailable("the sidecar's batching process is gone"))
            if not self.close_asked.done():
                self.close_asked.set_result(None)

    def _take(self, code: int, frame_id: int, payload: bytes) -> None:
        if code == link.STATE:
            state: State = pickle.loads(payload)
            self._settings, self._draining = state.settings, state.draining
            self._on_state(state)
        elif code == link.COLLECT:
            families = list(self._registry.collect())
            self._link.send(link.FAMILIES, frame_id, pickle.dumps(families))
        elif code == link.CLOSE:
            if not self.close_asked.done():
                self.close_asked.set_result(float(msgpack.unpackb(payload)))
        else:
            future = self._waiting.pop(frame_id, None)
            if future is None or future.done():
                return
            if code == link.ERROR:
                future.set_exception(link.decode_error(payload))
            else:
                future.set_result(payload)
            if not self._waiting:
                self._idle.set()
