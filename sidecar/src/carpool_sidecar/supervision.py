"""Background tasks that live as long as the sidecar, and say so loudly when one dies."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def supervised(
    jobs: Mapping[str, Coroutine[Any, Any, None]], on_death: Callable[[str], None]
) -> AsyncIterator[None]:
    """Run each job as a named task until the block ends, then cancel and await them all.

    Each job should run until cancelled; one that ends first is logged with its error and
    reported to `on_death` with its name.
    """

    def watch(task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        log.error("background task %s ended early", task.get_name(), exc_info=task.exception())
        on_death(task.get_name())

    tasks = [asyncio.create_task(job, name=name) for name, job in jobs.items()]
    for task in tasks:
        task.add_done_callback(watch)
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
