"""The operator's cache: BatchedModels, their children and their pods, kept by watches.

Every read of the reconciler comes from here (it is the KubeClient's `Store`), so a resync of
unchanged models sends the API server nothing; writes still go to the server. What a write
answers is kept at once, so that a reconcile right after an apply sees the applied object and
applies nothing; a watch event older than it (the same object, an earlier resourceVersion)
does not replace it, so a late event never makes the operator write again, nor undo a spec it
has just applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Mapping

# kopf's own matcher, so that the cache holds exactly the namespaces whose BatchedModels kopf
# hands to the handlers (its syntax has commas, `!` and an implied leading `*`).
from kopf._cogs.structs.references import NamespaceName, match_namespace

from carpool_operator.informer import Informer, OnChange, State
from carpool_operator.kube import KubeClient
from carpool_operator.names import KIND
from carpool_operator.render import MANAGED_BY
from carpool_operator.types import Manifest

# What carpool makes carries this label: the API server filters the watches by it, so a
# cluster-wide operator receives carpool's children and pods, not every one in the cluster.
MANAGED = f"app.kubernetes.io/managed-by={MANAGED_BY}"
# Each kind the reconciler reads, and the label selector of its list and watch.
CACHED = {
    KIND: "",
    "ConfigMap": MANAGED,
    "Service": MANAGED,
    "Deployment": MANAGED,
    "Pod": MANAGED,
    "PodDisruptionBudget": MANAGED,
    "HorizontalPodAutoscaler": MANAGED,
    "PodMonitor": MANAGED,
}
_PLAIN_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _matches(namespace: str, patterns: tuple[str, ...]) -> bool:
    """Whether kopf serves `namespace`: some one of the `--namespace` patterns matches it, or
    there are none (cluster-wide)."""
    name = NamespaceName(namespace)
    return not patterns or any(match_namespace(name, pattern) for pattern in patterns)


class Cache:
    """One informer per cached kind and namespace served (one for all, cluster-wide).

    Plain namespace names are watched one by one (a namespaced operator may list only those);
    kopf's patterns (`team-*`, `!kube-*`, `team-*,!team-x`) are matched here against
    cluster-wide watches.
    `retry_s`: how often a kind the operator may not list, or the cluster lacks, is tried.
    """

    def __init__(
        self,
        kube: KubeClient,
        namespaces: tuple[str, ...],
        on_change: OnChange,
        retry_s: float,
    ) -> None:
        plain = bool(namespaces) and all(_PLAIN_NAMESPACE.match(n) for n in namespaces)
        scopes = namespaces if plain else ("",)

        def keep(namespace: str) -> bool:
            return plain or _matches(namespace, namespaces)

        self._scoped = plain
        self._informers = {
            (kind, scope): Informer(kube, kind, scope, selector, keep, on_change, retry_s)
            for kind, selector in CACHED.items()
            for scope in scopes
        }
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start listing and watching (once: kopf may log in again)."""
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(informer.run(), name=f"watch {kind} {scope or '*'}")
                for (kind, scope), informer in self._informers.items()
            ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _informer(self, kind: str, namespace: str) -> Informer:
        return self._informers[kind, namespace if self._scoped else ""]

    async def _ready(self, kind: str, namespace: str) -> Informer | None:
        """The informer to read from; None for a kind the cluster does not serve.

        A kind the operator may not list raises the API server's 403, which names the verb.
        """
        informer = self._informer(kind, namespace)
        state = await informer.ready()
        if state is State.FORBIDDEN and informer.refusal is not None:
            raise informer.refusal
        return None if state is State.ABSENT else informer

    async def get(self, kind: str, namespace: str, name: str) -> Manifest | None:
        informer = await self._ready(kind, namespace)
        return informer.get(namespace, name) if informer is not None else None

    async def select(
        self, kind: str, namespace: str, selector: Mapping[str, str]
    ) -> list[Manifest]:
        informer = await self._ready(kind, namespace)
        return informer.select(namespace, selector) if informer is not None else []

    async def serves(self, kind: str) -> bool:
        informer = next(i for (k, _), i in self._informers.items() if k == kind)
        return await informer.ready() is not State.ABSENT

    def wrote(self, found: Manifest) -> None:
        metadata = found.get("metadata") or {}
        if found.get("kind") in CACHED:
            self._informer(found["kind"], metadata.get("namespace", "")).put(found)

    def deleted(self, kind: str, namespace: str, name: str) -> None:
        if kind in CACHED:
            self._informer(kind, namespace).forget(namespace, name)

    def models(self) -> list[tuple[str, str]]:
        """(namespace, name) of every BatchedModel kept."""
        informers = [i for (kind, _), i in self._informers.items() if kind == KIND]
        return [key for informer in informers for key in informer.kept()]
