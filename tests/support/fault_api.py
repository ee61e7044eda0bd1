"""The test API server, misbehaving on purpose: random errors, lost replies, dropped watches.

    with FaultyServedKubeApi(seed=7) as served:
        served.api.chaos = Chaos(rate=0.3, agents=("carpool-operator", "kopf"))
        served.drop_watches()            # every open watch ends now, as a dropped connection
        served.api.chaos = None          # behave again
        served.api.injected              # Counter of (method, code) injected so far

A fault hits only requests whose User-Agent contains one of `Chaos.agents`, so the test's own
kubectl is never disturbed. Each matching request draws once from a seeded generator: with
probability `rate` it fails, with one of `Chaos.codes` (409 only for writes, as a real API
server never answers a read with a conflict). A 409 is refused before anything is
stored (a lost race); a 5xx is a lost reply half the time: the write is stored, then the
client hears 500 anyway, so it must cope with "it failed" when it did not. The first matching
writes get `Chaos.opening` (by default a 409, a lost reply and a 503), so that a short run
sees every kind of fault.
Watch requests are never failed (kopf retries them on its own schedule); they are dropped.
With `watch_lag_s`, every watch hears of each write that long after it was answered, as from an
API server whose watch cache lags behind etcd (lists and writes' answers are current). With
`watch_cut_s`, every watch ends that long after it began, whatever its `timeoutSeconds`, as
behind a proxy that cuts long requests or from an API server going away (0: at once).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import functools
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import attrs
import kmock

from support.kube_api import WRITE_METHODS, ApiFailure, Json, Kind, KubeApiServer, ServedKubeApi

REASONS = {409: "Conflict", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}
MESSAGES = {
    409: "Operation cannot be fulfilled: the object has been modified; please apply your "
    "changes to the latest version and try again",
    500: "injected: internal error",
    503: "injected: the server is currently unable to handle the request",
    504: "injected: the server was unable to return a response in the time allotted",
}


@dataclass(frozen=True)
class Chaos:
    """What goes wrong, for whom, how often."""

    rate: float
    agents: tuple[str, ...]
    codes: tuple[int, ...] = (500, 409, 503)
    writes_only: bool = False
    # The first matching writes fail in this order, before any random draw, so that each
    # kind of fault happens at least once: (status, whether the write was stored anyway).
    opening: tuple[tuple[int, bool], ...] = ((409, False), (500, True), (503, False))


@attrs.define(kw_only=True)
class FaultyKubeApi(KubeApiServer):
    """KubeApiServer with seeded random faults and watches that can be cut."""

    seed: int = 0
    chaos: Chaos | None = None
    watch_lag_s: float = 0.0
    watch_cut_s: float | None = None
    injected: collections.Counter[tuple[str, int]] = attrs.field(
        init=False, factory=collections.Counter
    )
    lost_replies: int = attrs.field(init=False, default=0)
    dropped_watches: int = attrs.field(init=False, default=0)
    _written: int = attrs.field(init=False, default=0)  # the latest revision stored
    _random: random.Random = attrs.field(init=False)
    _opened: int = attrs.field(init=False, default=0)  # opening faults dealt so far
    _cut: asyncio.Event | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._random = random.Random(self.seed)

    def drop_watches(self) -> None:
        """End every open watch stream; call on the server's event loop."""
        if self._cut is not None:
            self._cut.set()
        self._cut = asyncio.Event()

    def _route(
        self, request: kmock.Request, method: str, headers: dict[str, str]
    ) -> tuple[int, Any]:
        watching = request.params.get("watch") in ("true", "1")
        chaos = self.chaos
        code, lost_reply = 0, False
        writing = method in WRITE_METHODS
        if (
            chaos is not None
            and not watching
            and any(agent in headers.get("user-agent", "") for agent in chaos.agents)
        ):
            # Only a write can conflict; a read fails only for server trouble.
            codes = [c for c in chaos.codes if writing or c != 409]
            if writing and self._opened < len(chaos.opening):
                code, lost_reply = chaos.opening[self._opened]
                self._opened += 1
            elif (
                codes and (writing or not chaos.writes_only) and self._random.random() < chaos.rate
            ):
                code = self._random.choice(codes)
                lost_reply = code >= 500 and writing and self._random.random() < 0.5
        if code and not lost_reply:
            self.injected[method, code] += 1
            raise ApiFailure(code, REASONS.get(code, "InternalError"), MESSAGES.get(code, ""))
        answer = super()._route(request, method, headers)
        if lost_reply:
            self.injected[method, code] += 1
            self.lost_replies += 1
            raise ApiFailure(code, REASONS.get(code, "InternalError"), MESSAGES.get(code, ""))
        return answer

    def _emit(self, kind: Kind, event_type: str, obj: Json, previous: Json | None = None) -> None:
        self._written = max(self._written, int(obj["metadata"]["resourceVersion"]))
        if self.watch_lag_s <= 0:
            super()._emit(kind, event_type, obj, previous)
            return
        # Every event waits as long, so they stay in order.
        emit = functools.partial(
            KubeApiServer._emit, self, kind, event_type, copy.deepcopy(obj), copy.deepcopy(previous)
        )
        asyncio.get_running_loop().call_later(self.watch_lag_s, emit)

    def _current_revision(self) -> int:
        # A list is read from storage, not from the lagging watch cache: it is current.
        return max(super()._current_revision(), self._written)

    def _watch(
        self, kind: Kind, namespace: str, params: dict[str, str], name: str
    ) -> AsyncIterator[Any]:
        if self._cut is None:
            self._cut = asyncio.Event()
        if self.watch_cut_s is not None:
            params = {**params, "timeoutSeconds": str(self.watch_cut_s)}
        return self._cuttable(super()._watch(kind, namespace, params, name), self._cut)

    async def _cuttable(self, stream: AsyncIterator[Any], cut: asyncio.Event) -> AsyncIterator[Any]:
        cutting = asyncio.ensure_future(cut.wait())
        try:
            while True:
                step = asyncio.ensure_future(anext(stream))
                await asyncio.wait({step, cutting}, return_when=asyncio.FIRST_COMPLETED)
                if not step.done():
                    step.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                        await step
                    self.dropped_watches += 1
                    return
                try:
                    event = step.result()
                except StopAsyncIteration:
                    return
                yield event
        finally:
            cutting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await cutting


class FaultyServedKubeApi(ServedKubeApi):
    """ServedKubeApi serving a FaultyKubeApi; `drop_watches` may be called from any thread."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.api: FaultyKubeApi = FaultyKubeApi(seed=seed)

    def __enter__(self) -> FaultyServedKubeApi:
        super().__enter__()
        return self

    def drop_watches(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.api.drop_watches)
