"""A reconcile run in process against the test API server, with a cache the test moves.

The operator reads from its cache, whose watches (one per kind) may tell of a write later than
it happened. `Heard` stands in for that cache: it holds each object as the test last let it
hear of it, and, as the real cache does, what the operator itself wrote.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import kopf
import yaml
from prometheus_client import CollectorRegistry

from carpool_operator.defaults import Defaults
from carpool_operator.kube import RESOURCES, KubeClient
from carpool_operator.metrics import OperatorMetrics
from carpool_operator.reconcile import Runtime, reconcile
from carpool_operator.types import Manifest
from support.kube_api import ServedKubeApi
from support.kube_cluster import CRD
from support.kube_http import call
from support.kube_models import model

LOG = logging.getLogger("test")


class Heard:
    """The operator's cache as its watches last told it: each object as it was when heard of,
    which may be behind the API server."""

    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube
        self._objects: dict[tuple[str, str, str], Manifest] = {}

    async def hear(self, kind: str, name: str) -> None:
        """The watch of `kind` tells of the object as the API server has it now."""
        found = await self._kube.fetch(kind, "default", name)
        if found is None:
            self._objects.pop((kind, "default", name), None)
        else:
            self._objects[kind, "default", name] = found

    async def get(self, kind: str, namespace: str, name: str) -> Manifest | None:
        return self._objects.get((kind, namespace, name))

    async def select(
        self, kind: str, namespace: str, selector: Mapping[str, str]
    ) -> list[Manifest]:
        return []

    async def serves(self, kind: str) -> bool:
        return True

    def wrote(self, found: Manifest) -> None:
        metadata = found["metadata"]
        self._objects[found["kind"], metadata["namespace"], metadata["name"]] = found

    def deleted(self, kind: str, namespace: str, name: str) -> None:
        self._objects.pop((kind, namespace, name), None)


@contextmanager
def served_with_crd() -> Iterator[ServedKubeApi]:
    """A test API server that serves BatchedModels."""
    with ServedKubeApi() as server:
        crd = yaml.safe_load(CRD.read_text())
        path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        assert call(server, "POST", path, crd)[0] == 201
        yield server


@asynccontextmanager
async def client_of(served: ServedKubeApi) -> AsyncIterator[KubeClient]:
    client = KubeClient()
    client.login(kopf.ConnectionInfo(server=served.url))
    try:
        yield client
    finally:
        await client.close()


def children(name: str) -> list[tuple[str, str]]:
    return [("ConfigMap", f"{name}-batching"), ("Deployment", name), ("Service", name)]


def live(served: ServedKubeApi, kind: str, name: str) -> dict[str, Any] | None:
    status, found = call(served, "GET", RESOURCES[kind].path("default", name))
    return found if status == 200 else None


async def made(
    served: ServedKubeApi, kube: KubeClient, name: str, heard: Heard | None = None, **spec: Any
) -> tuple[Runtime, Heard]:
    """A model and its children, made by a reconcile whose cache (`heard`, or a new one)
    heard of everything."""
    body = model(name, **spec)
    assert call(served, "POST", RESOURCES["BatchedModel"].path("default"), body)[0] == 201
    heard = heard or Heard(kube)
    kube.store = heard
    await heard.hear("BatchedModel", name)
    runtime = Runtime(Defaults(), OperatorMetrics(CollectorRegistry()), kube)
    await reconcile(runtime, "default", name, LOG)
    for kind, child in children(name):
        found = live(served, kind, child)
        assert found is not None and found["metadata"]["ownerReferences"], kind
    return runtime, heard
