"""The batching process's side of the links: every front's items into the one engine."""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle

import msgpack
from prometheus_client import Metric

from carpool.contract import frames, wire
from carpool.engine.errors import INTERNAL_MESSAGE, SidecarError
from carpool_sidecar.build import Sidecar
from carpool_sidecar.fronts import link, pod_metrics
from carpool_sidecar.fronts.link import Link, State

log = logging.getLogger(__name__)

# How often the fronts' view of the model state and the settings is brought up to date.
STATE_INTERVAL_S = 0.05
# A front that does not send its metrics within this is left out of a scrape.
COLLECT_TIMEOUT_S = 2.0


class _Front:
    """One front's link and what it asked for that is not yet answered."""

    def __init__(self, channel: Link) -> None:
        self.link = channel
        self.submits: dict[int, asyncio.Task[None]] = {}
        self.collects: dict[int, asyncio.Future[None]] = {}
        self.closed = asyncio.Event()
        # Its metrics as last sent: they stand in for a front slow to send them, and stay
        # in the pod's counts once it exits.
        self.families: list[Metric] = []


class Hub:
    """Serves every front's link: submits, scrapes; and tells each the state as it changes."""

    def __init__(self, sidecar: Sidecar) -> None:
        self._sidecar = sidecar
        self._fronts: set[_Front] = set()
        self._ids = itertools.count()
        self._told: bytes | None = None
        # The counters and histograms of fronts that exited, so that the pod's never fall.
        self._departed: list[Metric] = []

    def state(self) -> State:
        sidecar = self._sidecar
        dataplane, batcher = sidecar.dataplane, sidecar.batcher
        return State(
            sidecar.state.ready, sidecar.state.metadata, batcher.settings, batcher.draining,
            dataplane.stopping, dataplane.broken,
        )  # fmt: skip

    async def tell(self) -> None:
        """Runs until cancelled: each change of state goes to every front."""
        while True:
            told = pickle.dumps(self.state())
            if told != self._told:
                self._told = told
                for front in self._fronts:
                    front.link.send(link.STATE, 0, told)
            await asyncio.sleep(STATE_INTERVAL_S)

    async def serve(self, channel: Link) -> None:
        """Serve one front's link until it closes; its requests still waiting are dropped."""
        front = _Front(channel)
        self._fronts.add(front)
        channel.send(link.STATE, 0, pickle.dumps(self.state()))
        try:
            async for code, frame_id, payload in channel.frames():
                self._take(front, code, frame_id, payload)
        finally:
            self._fronts.discard(front)
            self._departed = pod_metrics.counts(pod_metrics.merge(self._departed, [front.families]))
            front.closed.set()
            for task in front.submits.values():
                task.cancel()
            for future in front.collects.values():
                if not future.done():
                    future.set_result(None)

    async def close_ports(self, grace_s: float, timeout_s: float) -> None:
        """Ask every front to stop accepting; return once all have, or after `timeout_s`."""
        closing = [asyncio.create_task(self._closed(front, grace_s)) for front in self._fronts]
        if closing:
            await asyncio.wait(closing, timeout=timeout_s)
        for task in closing:
            task.cancel()

    async def _closed(self, front: _Front, grace_s: float) -> None:
        front.link.send(link.CLOSE, 0, msgpack.packb(grace_s))
        await front.closed.wait()

    def _take(self, front: _Front, code: int, frame_id: int, payload: bytes) -> None:
        if code == link.SUBMIT:
            task = asyncio.create_task(self._submit(front, frame_id, payload))
            front.submits[frame_id] = task
        elif code == link.CANCEL:
            if (cancelled := front.submits.pop(frame_id, None)) is not None:
                cancelled.cancel()
        elif code == link.SCRAPE:
            task = asyncio.create_task(self._scrape(front, frame_id))
            front.submits[frame_id] = task
        elif code == link.FAMILIES:
            front.families = pickle.loads(payload)
            future = front.collects.pop(frame_id, None)
            if future is not None and not future.done():
                future.set_result(None)
        elif code == link.CLOSED:
            front.closed.set()
        elif code == link.GENERATED and (counted := self._sidecar.dataplane.whole_generation):
            counted(*pickle.loads(payload))

    async def _submit(self, front: _Front, frame_id: int, payload: bytes) -> None:
        try:
            submit = link.decode_submit(payload)
            results = await self._sidecar.batcher.submit(
                submit.items, submit.key, submit.deadline, priority=submit.priority,
                lengths=submit.lengths, nbytes=submit.nbytes, arrived_at=submit.arrived_at,
            )  # fmt: skip
        except SidecarError as error:
            front.link.send(link.ERROR, frame_id, link.encode_error(error))
        except Exception:
            log.exception("unexpected error batching a front's request")
            _internal_error(front, frame_id)
        else:
            front.link.send(link.RESULT, frame_id, wire.encode_response(results))
        finally:
            front.submits.pop(frame_id, None)

    async def _scrape(self, front: _Front, frame_id: int) -> None:
        try:
            for update in self._sidecar.before_scrape:
                update()
            own = list(self._sidecar.registry.collect())
            await asyncio.gather(*(self._collect(each) for each in list(self._fronts)))
            # A front that exited meanwhile counts among the departed, and only there.
            theirs = [each.families for each in self._fronts]
            text = pod_metrics.render(own, [*theirs, self._departed])
        except Exception:
            # Answered at once, a 500 to the scrape, rather than left to the front's timeout.
            log.exception("unexpected error gathering the pod's metrics")
            _internal_error(front, frame_id)
        else:
            front.link.send(link.METRICS, frame_id, text)
        finally:
            front.submits.pop(frame_id, None)

    async def _collect(self, front: _Front) -> None:
        """Bring `front.families` up to date; left as they were if it is slow to answer."""
        frame_id = next(self._ids) % frames.ID_MODULUS
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        front.collects[frame_id] = future
        front.link.send(link.COLLECT, frame_id)
        try:
            async with asyncio.timeout(COLLECT_TIMEOUT_S):
                await future
        except TimeoutError:
            log.warning("a front process sent no metrics within %.1f s", COLLECT_TIMEOUT_S)
        finally:
            front.collects.pop(frame_id, None)


def _internal_error(front: _Front, frame_id: int) -> None:
    """What the front hears of a bug here: a 500, the details left in this log."""
    front.link.send(link.ERROR, frame_id, link.encode_error(SidecarError(INTERNAL_MESSAGE)))
