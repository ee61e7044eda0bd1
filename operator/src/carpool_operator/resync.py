"""The periodic resync: every BatchedModel compared with its children even without events.

An operator-wide loop rather than a kopf timer: kopf puts a finalizer on every object that has
a per-object timer, and a finalizer would make deleting a BatchedModel hang whenever no
operator runs (after `helm uninstall`, say). It reads the models and their children from the
watches' cache, so a resync of unchanged models sends no request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from carpool_operator.triggers import Reconcile, reconcile_logged


async def resync_forever(
    models: Callable[[], list[tuple[str, str]]],
    interval_s: float,
    reconcile: Reconcile,
    done: Callable[[], None],
) -> None:
    """Every `interval_s`, reconcile each of `models()` (namespace, name); `done` hears of
    every pass that went over all of them."""
    while True:
        await asyncio.sleep(interval_s)
        for namespace, name in models():
            await reconcile_logged(reconcile, namespace, name, "resync")
        done()
