"""Reconciles that the watches ask for: one task per model, at most one reconcile waiting.

A watch event comes after the cache holds it, so the reconcile it starts reads what the event
said. Events that arrive before a model's reconcile has started add nothing: it will read
the latest anyway; those that arrive while it runs ask for one more after it, as client-go's
work queue does (a rollout's pod events, during a reconcile slowed by the API server, would
otherwise queue a reconcile each).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import kopf

from carpool_operator.kube import ApiError

log = logging.getLogger("carpool_operator.triggers")
Reconcile = Callable[[str, str], Awaitable[None]]


async def reconcile_logged(reconcile: Reconcile, namespace: str, name: str, why: str) -> None:
    """One reconcile outside kopf's handlers, whose failure is only logged.

    The next event or resync tries again; the status already says what is wrong.
    """
    try:
        await reconcile(namespace, name)
    except (kopf.TemporaryError, kopf.PermanentError, ApiError) as error:
        log.debug(f"{why} of {namespace}/{name}: {error}")
    except Exception:  # a bug in one model's reconcile must not end the caller's loop
        log.exception(f"{why} of {namespace}/{name} failed")


class Triggers:
    """Reconciles asked for by watch events, cancelled and awaited at `close`."""

    def __init__(self, reconcile: Reconcile) -> None:
        self._reconcile = reconcile
        self._waiting: set[tuple[str, str]] = set()  # asked for, not started
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}  # one per model, if any

    def ask(self, namespace: str, name: str) -> None:
        """Reconcile the model soon, unless a reconcile of it is waiting already."""
        key = (namespace, name)
        self._waiting.add(key)
        if key not in self._tasks:
            self._tasks[key] = asyncio.create_task(self._run(key), name=f"reconcile {name}")

    async def _run(self, key: tuple[str, str]) -> None:
        try:
            while key in self._waiting:
                await asyncio.sleep(0)  # let the events that came with this one join it
                self._waiting.discard(key)
                await reconcile_logged(self._reconcile, *key, "watch event")
        finally:
            # No await since the last look at `_waiting`: an ask from now on starts a task.
            del self._tasks[key]

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
