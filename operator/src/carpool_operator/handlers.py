"""kopf handlers: thin wrappers that hand every trigger to `reconcile`.

kopf watches the BatchedModels; the operator's cache (cache.py) watches them too, with their
children and pods, and asks for a reconcile of the model each change concerns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf

from carpool_operator.cache import Cache
from carpool_operator.defaults import Defaults
from carpool_operator.kube import KubeClient
from carpool_operator.metrics import OperatorMetrics
from carpool_operator.names import API_VERSION, DOMAIN, GROUP, KIND, PLURAL, VERSION
from carpool_operator.reconcile import Runtime, reconcile
from carpool_operator.resync import resync_forever
from carpool_operator.triggers import Triggers
from carpool_operator.types import Manifest

INSTANCE_LABEL = "app.kubernetes.io/instance"


def models_of(kind: str, found: Manifest) -> list[tuple[str, str]]:
    """The BatchedModels (namespace, name) that an object's change concerns.

    Itself; a child's owner; a pod's model, named by its instance label.
    """
    metadata = found.get("metadata") or {}
    namespace = str(metadata.get("namespace", ""))
    if kind == KIND:
        return [(namespace, str(metadata.get("name", "")))]
    if kind == "Pod":
        name = (metadata.get("labels") or {}).get(INSTANCE_LABEL)
        return [(namespace, str(name))] if name else []
    return [
        (namespace, str(owner["name"]))
        for owner in metadata.get("ownerReferences") or []
        if owner.get("kind") == KIND and owner.get("apiVersion") == API_VERSION
    ]


def _runtime(memo: Any) -> Runtime:
    runtime = memo["runtime"]
    assert isinstance(runtime, Runtime)
    return runtime


async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Every operator setting, in one place."""
    settings.persistence.finalizer = f"{DOMAIN}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=DOMAIN)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=DOMAIN, key="last-handled-configuration"
    )
    # Events come only from explicit kopf.info/warn (transitions, child changes); log lines
    # stay log lines, so a quiet resync never writes an event.
    settings.posting.loggers = False
    settings.posting.level = logging.INFO
    # Reconnect kopf's watch of BatchedModels now and then, so that a dropped connection heals
    # (the cache's watches do the same, see informer.py).
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    # main() parsed and checked the defaults, and owns the metrics (their server outlives kopf).
    defaults, metrics = memo["defaults"], memo["metrics"]
    assert isinstance(defaults, Defaults) and isinstance(metrics, OperatorMetrics)
    kube = KubeClient(on_write=metrics.wrote)
    logger = logging.getLogger("carpool_operator")

    async def run(namespace: str, name: str) -> None:
        await reconcile(runtime, namespace, name, logger)

    triggers = Triggers(run)

    def changed(kind: str, found: Manifest) -> None:
        for namespace, name in models_of(kind, found):
            triggers.ask(namespace, name)

    interval = memo["resync_seconds"]
    # Kinds the operator may not list, or the cluster lacks, are looked for again as often.
    cache = Cache(kube, memo["namespaces"], changed, retry_s=interval)
    kube.store = cache
    runtime = Runtime(defaults, metrics, kube, cache=cache, triggers=triggers)
    memo["runtime"] = runtime
    # Owned by the runtime: `cleanup` cancels and awaits it (the cache starts at login).
    runtime.resync = asyncio.create_task(
        resync_forever(cache.models, interval, run, metrics.resynced)
    )


async def login(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf's own minimal logins, shared with the children's client; the cache then starts."""
    info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(
        settings=settings
    )
    if info is None:
        raise kopf.LoginError("neither a service account nor a kubeconfig is available")
    runtime = _runtime(memo)
    runtime.kube.login(info)
    if runtime.cache is not None:
        runtime.cache.start()
    return info


async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop what the runtime owns: the resync, the reconciles events asked for, the watches."""
    runtime = _runtime(memo)
    if runtime.resync is not None:
        runtime.resync.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runtime.resync
    if runtime.triggers is not None:
        await runtime.triggers.close()
    if runtime.cache is not None:
        await runtime.cache.close()
    await runtime.kube.close()


# kopf declares `memo` as Any in its handler protocols; _runtime() narrows it.
async def on_model(
    name: str, namespace: str | None, memo: Any, logger: kopf.Logger, retry: int, **_: Any
) -> None:
    """Create, update and resume converge the same way (and so do the resync and the cache's
    watch events: a changed child or pod, a deleted BatchedModel)."""
    await reconcile(_runtime(memo), namespace or "default", name, logger, retry)


def register(registry: kopf.OperatorRegistry) -> None:
    kopf.on.startup(registry=registry)(configure)
    kopf.on.login(registry=registry)(login)
    kopf.on.cleanup(registry=registry)(cleanup)
    kopf.on.create(GROUP, VERSION, PLURAL, registry=registry, id="create")(on_model)
    kopf.on.update(GROUP, VERSION, PLURAL, registry=registry, id="update")(on_model)
    kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry, id="resume")(on_model)
