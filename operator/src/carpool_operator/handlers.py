"""kopf handlers: thin wrappers that hand every trigger to `reconcile`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf

from carpool_operator.defaults import Defaults
from carpool_operator.kube import KubeClient
from carpool_operator.metrics import OperatorMetrics
from carpool_operator.reconcile import Runtime, reconcile
from carpool_operator.render import GROUP, KIND, MANAGED_BY, VERSION
from carpool_operator.resync import resync_forever

PLURAL = "batchedmodels"
DOMAIN = "carpool.dev"
# Children the operator watches so that deleting or hand-editing one is repaired at once.
WATCHED_CHILDREN = (("", "v1", "configmaps"), ("", "v1", "services"), ("apps", "v1", "deployments"))
# The models' pods, watched so that their failures reach the status within seconds.
PODS = ("", "v1", "pods")
CHILD_LABELS = {"app.kubernetes.io/managed-by": MANAGED_BY}
INSTANCE_LABEL = "app.kubernetes.io/instance"


def _carpool_labelled(resource: kopf.Resource) -> bool:
    """The kinds whose watches only carpool's objects need: the children and the pods."""
    return (resource.group, resource.version, resource.plural) in (*WATCHED_CHILDREN, PODS)


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
    # Reconnect watches now and then, so that a silently dropped connection heals.
    # The API server filters these watches by label: a cluster-wide operator then receives
    # carpool's ConfigMaps, Services, Deployments and pods only, not every one in the cluster.
    selector = ",".join(f"{key}={value}" for key, value in CHILD_LABELS.items())
    settings.watching.label_selectors[_carpool_labelled] = selector
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = 60
    # main() parsed and checked the defaults, and owns the metrics (their server outlives kopf).
    defaults, metrics = memo["defaults"], memo["metrics"]
    assert isinstance(defaults, Defaults) and isinstance(metrics, OperatorMetrics)
    runtime = Runtime(defaults, metrics, KubeClient(on_write=metrics.wrote))
    memo["runtime"] = runtime
    logger = logging.getLogger("carpool_operator")

    async def resync(namespace: str, name: str) -> None:
        await reconcile(runtime, namespace, name, logger)

    # Owned by the runtime: `cleanup` cancels and awaits it.
    runtime.resync = asyncio.create_task(
        resync_forever(
            runtime.kube, memo["namespaces"], memo["resync_seconds"], resync, metrics.resynced
        )
    )


def login(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """kopf's own minimal logins, shared with the children's client."""
    info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(
        settings=settings
    )
    if info is None:
        raise kopf.LoginError("neither a service account nor a kubeconfig is available")
    _runtime(memo).kube.login(info)
    return info


async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    runtime = _runtime(memo)
    if runtime.resync is not None:
        runtime.resync.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runtime.resync
    await runtime.kube.close()


# kopf declares `memo` as Any in its handler protocols; _runtime() narrows it.
async def on_model(
    name: str, namespace: str | None, memo: Any, logger: kopf.Logger, **_: Any
) -> None:
    """Create, update and resume converge the same way (and so does the resync loop)."""
    await reconcile(_runtime(memo), namespace or "default", name, logger)


async def on_model_event(
    event: kopf.RawEvent, name: str, namespace: str | None, memo: Any, **_: Any
) -> None:
    """A deleted BatchedModel leaves the models gauge (no reconcile runs for it any more)."""
    if event.get("type") != "DELETED":
        return
    runtime, namespace = _runtime(memo), namespace or "default"
    # After any reconcile in flight, which would count the model again.
    async with runtime.locks[namespace, name]:
        runtime.metrics.forget(namespace, name)


async def on_child(
    meta: kopf.Meta, namespace: str | None, memo: Any, logger: kopf.Logger, **_: Any
) -> None:
    for owner in meta.get("ownerReferences", []):
        if owner.get("kind") == KIND and owner.get("apiVersion") == f"{GROUP}/{VERSION}":
            await reconcile(_runtime(memo), namespace or "default", owner["name"], logger)


async def on_pod(
    labels: kopf.Labels, namespace: str | None, memo: Any, logger: kopf.Logger, **_: Any
) -> None:
    """A pod of a model changed: its failures (or recovery) go to the model's status."""
    name = labels.get(INSTANCE_LABEL)
    if name:
        await reconcile(_runtime(memo), namespace or "default", name, logger)


def register(registry: kopf.OperatorRegistry) -> None:
    kopf.on.startup(registry=registry)(configure)
    kopf.on.login(registry=registry)(login)
    kopf.on.cleanup(registry=registry)(cleanup)
    kopf.on.create(GROUP, VERSION, PLURAL, registry=registry, id="create")(on_model)
    kopf.on.update(GROUP, VERSION, PLURAL, registry=registry, id="update")(on_model)
    kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry, id="resume")(on_model)
    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry, id="forget")(on_model_event)
    for group, version, plural in WATCHED_CHILDREN:
        kopf.on.event(group, version, plural, registry=registry, labels=CHILD_LABELS)(on_child)
    group, version, plural = PODS
    kopf.on.event(group, version, plural, registry=registry, labels=CHILD_LABELS)(on_pod)
