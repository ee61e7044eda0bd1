"""The periodic resync: every BatchedModel compared with its children even without events.

An operator-wide loop rather than a kopf timer: kopf puts a finalizer on every object that has
a per-object timer, and a finalizer would make deleting a BatchedModel hang whenever no
operator runs (after `helm uninstall`, say).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import kopf

from carpool_operator.kube import ApiError, KubeClient

log = logging.getLogger("carpool_operator.resync")
Reconcile = Callable[[str, str], Awaitable[None]]


async def resync_forever(
    kube: KubeClient,
    namespaces: tuple[str, ...],
    interval_s: float,
    reconcile: Reconcile,
    done: Callable[[], None],
) -> None:
    """Every `interval_s`, reconcile each BatchedModel of `namespaces` (all when empty).

    `done` hears of every pass that went over all of them.
    """
    while True:
        await asyncio.sleep(interval_s)
        try:
            models = await kube.list_models(namespaces)
        except ApiError as error:
            log.warning(f"resync: cannot list BatchedModels: {error}")
            continue
        for namespace, name in models:
            try:
                await reconcile(namespace, name)
            except (kopf.TemporaryError, kopf.PermanentError, ApiError) as error:
                # The next resync (or event) tries again; the status already says what is wrong.
                log.debug(f"resync of {namespace}/{name}: {error}")
            except Exception:  # a bug in one model's reconcile must not end every resync
                log.exception(f"resync of {namespace}/{name} failed")
        done()
