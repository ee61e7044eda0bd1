"""Reconciles that the watches ask for: at most one waiting per model, each an owned task.

A watch event comes after the cache holds it, so the reconcile it starts reads what the event
said. Events that arrive before a model's reconcile has started add nothing: it will read
the latest anyway.
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
        self._waiting: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def ask(self, namespace: str, name: str) -> None:
        """Reconcile the model soon, unless a reconcile of it is waiting already."""
        if (namespace, name) in self._waiting:
            return
        self._waiting.add((namespace, name))
        task = asyncio.create_task(self._run(namespace, name), name=f"reconcile {name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, namespace: str, name: str) -> None:
        await asyncio.sleep(0)  # let the events that came with this one join it
        self._waiting.discard((namespace, name))
        await reconcile_logged(self._reconcile, namespace, name, "watch event")

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
