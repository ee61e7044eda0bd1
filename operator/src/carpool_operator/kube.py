"""A small Kubernetes REST client for the children the operator owns.

kopf watches and patches BatchedModels itself; this client applies (server-side) and deletes
the children, lists and watches what the operator caches, with the same credentials kopf
logged in with (see `handlers.login`). Its reads come from that cache (`Store`, see cache.py),
never from a request of their own. docs/operator.md says why this is not the `kubernetes`
package's client.
"""

from __future__ import annotations

import datetime
import json
import logging
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import kopf

from carpool_operator.names import GROUP, KIND, PLURAL, VERSION
from carpool_operator.types import Manifest

USER_AGENT = "carpool-operator/0.1.0"
MERGE_PATCH = "application/merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
# The field manager of every server-side apply: carpool owns exactly the fields it renders.
FIELD_MANAGER = "carpool"


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def root(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"

    def collection(self, namespace: str = "") -> str:
        """The path of the objects in `namespace`, or in every namespace."""
        if not namespace:
            return f"{self.root}/{self.plural}"
        return f"{self.root}/namespaces/{namespace}/{self.plural}"

    def path(self, namespace: str, name: str = "", subresource: str = "") -> str:
        path = self.collection(namespace)
        if name:
            path += f"/{name}"
        if subresource:
            path += f"/{subresource}"
        return path


log = logging.getLogger("carpool_operator.kube")

# Every kind the operator writes, by kind (RBAC in docs/operator.md lists the same).
RESOURCES: dict[str, Resource] = {
    "ConfigMap": Resource("", "v1", "configmaps"),
    "Service": Resource("", "v1", "services"),
    "Deployment": Resource("apps", "v1", "deployments"),
    "PodDisruptionBudget": Resource("policy", "v1", "poddisruptionbudgets"),
    "HorizontalPodAutoscaler": Resource("autoscaling", "v2", "horizontalpodautoscalers"),
    "PodMonitor": Resource("monitoring.coreos.com", "v1", "podmonitors"),
    KIND: Resource(GROUP, VERSION, PLURAL),
    "Event": Resource("", "v1", "events"),
    "Pod": Resource("", "v1", "pods"),
}
REPORTING_COMPONENT = "carpool-operator"
# No Kubernetes object comes near this (etcd refuses requests over 1.5 MiB by default): a watch
# line longer than this is not one, and ends the watch.
MAX_EVENT_BYTES = 4 * 1024 * 1024
# Requests in flight at once (aiohttp's default); the watches have their own connections.
REQUEST_CONNECTIONS = 100


# The API server's answer to an apply it cannot type against the kind's schema (duplicate keys
# in a list merged by key, a field the kind does not declare): a bare 500 with this text
# (k8s.io/apimachinery managedfields, structuredmerge.go). The same request fails the same way.
UNTYPABLE_APPLY = "failed to create typed patch object"
# Retries wait FIRST_RETRY_S (LONG_FIRST_RETRY_S after throttling or a refusal of permission,
# CONFLICT_FIRST_RETRY_S after a write lost to another since the read: the cache has its news
# within moments, and a spec change during a rollout should not wait seconds for it), twice as
# long after each failure in a row, at most MAX_RETRY_S.
FIRST_RETRY_S = 5.0
LONG_FIRST_RETRY_S = 30.0
CONFLICT_FIRST_RETRY_S = 0.5
MAX_RETRY_S = 600.0


class ApiError(Exception):
    """A non-success answer of the API server."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def transient(self) -> bool:
        """Worth retrying: expired credentials (kopf renews them), missing permissions
        (someone may grant them), conflicts, throttling, server trouble; not a request the API
        server refuses as such (400, 422, an apply it cannot type)."""
        if self.status >= 500:
            return UNTYPABLE_APPLY not in self.message
        return self.status in (401, 403, 404, 409, 429)

    def retry_delay(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (0: the first) of a transient error."""
        first = {403: LONG_FIRST_RETRY_S, 429: LONG_FIRST_RETRY_S, 409: CONFLICT_FIRST_RETRY_S}
        return min(MAX_RETRY_S, first.get(self.status, FIRST_RETRY_S) * 2.0 ** min(retry, 32))


def _error(status: int, payload: Any) -> ApiError:
    """The API server's meta/v1 Status as an ApiError."""
    reason = message = ""
    if isinstance(payload, dict):
        reason = str(payload.get("reason", ""))
        message = str(payload.get("message", ""))
    return ApiError(status, reason, message)


class Store(Protocol):
    """Where the client's reads come from: the objects its watches keep (cache.Cache)."""

    async def get(self, kind: str, namespace: str, name: str) -> Manifest | None: ...

    async def select(
        self, kind: str, namespace: str, selector: Mapping[str, str]
    ) -> list[Manifest]: ...

    async def serves(self, kind: str) -> bool: ...

    def wrote(self, found: Manifest) -> None: ...

    def deleted(self, kind: str, namespace: str, name: str) -> None: ...


class KubeClient:
    """One aiohttp session against the API server; credentials arrive from kopf's login.

    `on_write` hears the kind of every create, patch and delete the server accepted. `store`
    answers the reads and hears what each write left on the server, so that a read right after
    a write sees it.
    """

    def __init__(self, on_write: Callable[[str], None] | None = None) -> None:
        self._info: kopf.ConnectionInfo | None = None
        self._session: aiohttp.ClientSession | None = None
        self._watching: aiohttp.ClientSession | None = None
        self._on_write = on_write
        self.store: Store | None = None

    def login(self, info: kopf.ConnectionInfo) -> None:
        self._info = info

    async def close(self) -> None:
        for session in (self._session, self._watching):
            if session is not None:
                await session.close()
        self._session = self._watching = None

    def _new_session(self, info: kopf.ConnectionInfo, limit: int) -> aiohttp.ClientSession:
        context: ssl.SSLContext | bool = (
            info.as_ssl_context() if info.server.startswith("https") else False
        )
        return aiohttp.ClientSession(
            headers={"User-Agent": USER_AGENT},
            connector=aiohttp.TCPConnector(ssl=context, limit=limit),
            timeout=aiohttp.ClientTimeout(total=30),
        )

    def _client(self) -> tuple[aiohttp.ClientSession, kopf.ConnectionInfo]:
        if self._info is None:
            raise ApiError(503, "NotLoggedIn", "no credentials yet")
        if self._session is None:
            self._session = self._new_session(self._info, REQUEST_CONNECTIONS)
        return self._session, self._info

    def _watcher(self) -> tuple[aiohttp.ClientSession, kopf.ConnectionInfo]:
        """The watches' own session: each holds a connection for minutes, and there are as
        many as kinds times namespaces, so they must not take the requests' connections."""
        if self._info is None:
            raise ApiError(503, "NotLoggedIn", "no credentials yet")
        if self._watching is None:
            self._watching = self._new_session(self._info, 0)  # 0: no limit
        return self._watching, self._info

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Manifest | None = None,
        content_type: str = "",
        params: dict[str, str] | None = None,
    ) -> Any:
        session, info = self._client()
        # Credentials per request: kopf may log in again (a refreshed token) at any time.
        headers = info.as_http_headers()
        if content_type:
            headers["Content-Type"] = content_type
        url = info.server.rstrip("/") + path
        try:
            async with session.request(
                method, url, json=body, headers=headers, params=params
            ) as response:
                payload = await response.json(content_type=None)
                if response.status >= 400:
                    raise _error(response.status, payload)
                return payload
        except (aiohttp.ClientError, TimeoutError) as error:
            raise ApiError(503, type(error).__name__, str(error)) from error

    def _store(self) -> Store:
        if self.store is None:
            raise ApiError(503, "NotWatching", "the operator's watches have not started")
        return self.store

    async def get(self, kind: str, namespace: str, name: str) -> Manifest | None:
        return await self._store().get(kind, namespace, name)

    async def fetch(self, kind: str, namespace: str, name: str) -> Manifest | None:
        """The object as the API server has it now, past the cache; None when there is none.

        The cache holds only what carries carpool's label: an object of another owner under
        a child's name is seen only here.
        """
        try:
            found = await self._request("GET", RESOURCES[kind].path(namespace, name))
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return found if isinstance(found, dict) else None

    async def select(self, kind: str, namespace: str, selector: dict[str, str]) -> list[Manifest]:
        """The objects of a kind in a namespace whose labels match `selector`."""
        return await self._store().select(kind, namespace, selector)

    async def serves(self, kind: str) -> bool:
        """Whether the cluster serves this kind (a PodMonitor needs the Prometheus Operator)."""
        return await self._store().serves(kind)

    async def list(self, path: str, selector: str) -> Manifest:
        """A collection, with the resourceVersion to watch it from."""
        params = {"labelSelector": selector} if selector else {}
        listing = await self._request("GET", path, params=params)
        if not isinstance(listing, dict):
            raise ApiError(503, "BadList", f"GET {path} answered no object")
        return listing

    async def watch(self, path: str, params: dict[str, str]) -> AsyncIterator[Manifest]:
        """The events of one watch of `path`, until the server ends it or the line drops.

        The server ends it after `timeoutSeconds` (in `params`); the client waits that long
        and a minute more for a line before it gives up.
        """
        session, info = self._watcher()
        url = info.server.rstrip("/") + path
        query = {**params, "watch": "true"}
        idle = float(params.get("timeoutSeconds", 0)) + 60
        timeout = aiohttp.ClientTimeout(total=None, sock_read=idle)
        try:
            async with session.get(
                url, headers=info.as_http_headers(), params=query, timeout=timeout
            ) as response:
                if response.status >= 400:
                    raise _error(response.status, await response.json(content_type=None))
                pending = b""
                async for chunk in response.content.iter_any():
                    lines = (pending + chunk).split(b"\n")
                    pending = lines.pop()
                    if len(pending) > MAX_EVENT_BYTES:
                        raise ApiError(503, "EventTooLarge", f"a watch line over {len(pending)}")
                    for line in lines:
                        if line.strip():
                            yield json.loads(line)
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            raise ApiError(503, type(error).__name__, str(error)) from error

    def _wrote(self, kind: str, found: Any = None) -> None:
        if self._on_write is not None:
            self._on_write(kind)
        if isinstance(found, dict) and self.store is not None:
            self.store.wrote(found)

    async def apply(
        self, manifest: Manifest, *, manager: str = FIELD_MANAGER, force: bool = True
    ) -> Manifest:
        """Server-side apply, forced: the child ends up with exactly the fields carpool renders.

        Fields carpool applied before and no longer renders are removed; fields other managers
        own (an HPA's replicas, an injected container) are left alone. Another `manager`, not
        forced, takes part in a hand-over (handover.py): a conflict is then an ApiError 409,
        as it is when `manifest` names a resourceVersion the child no longer has. Returns the
        child as the apply left it.
        """
        kind, metadata = manifest["kind"], manifest["metadata"]
        path = RESOURCES[kind].path(metadata["namespace"], metadata["name"])
        params = {"fieldManager": manager}
        if force:
            params["force"] = "true"
        found = await self._request(
            "PATCH", path, body=manifest, content_type=APPLY_PATCH, params=params
        )
        if not isinstance(found, dict):
            raise ApiError(503, "BadApply", f"PATCH {path} answered no object")
        self._wrote(kind, found)
        return found

    async def merge_patch(
        self, kind: str, namespace: str, name: str, patch: Manifest, *, subresource: str = ""
    ) -> None:
        path = RESOURCES[kind].path(namespace, name, subresource)
        found = await self._request("PATCH", path, body=patch, content_type=MERGE_PATCH)
        self._wrote(kind, found)

    async def delete(
        self, kind: str, namespace: str, name: str, *, judged: Manifest | None = None
    ) -> bool:
        """Delete the object; `judged`: only as it was then (its uid and resourceVersion as
        preconditions: ApiError 409 if anything wrote it since). False if it was gone already."""
        options = None
        if judged is not None:
            metadata = judged["metadata"]
            wanted = {"uid": metadata["uid"], "resourceVersion": metadata["resourceVersion"]}
            options = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": wanted}
        try:
            await self._request("DELETE", RESOURCES[kind].path(namespace, name), body=options)
        except ApiError as error:
            if error.status != 404:
                raise
            deleted = False
        else:
            self._wrote(kind)
            deleted = True
        if self.store is not None:  # gone either way
            self.store.deleted(kind, namespace, name)
        return deleted

    async def post_event(
        self, about: Manifest, reason: str, message: str, *, warning: bool
    ) -> None:
        """A core/v1 Event on `about`, for `kubectl describe`; a failure is only logged.

        Posted here rather than with kopf.info/warn: kopf can post only from inside its own
        handlers, and the resync loop is not one.
        """
        metadata = about["metadata"]
        now = datetime.datetime.now(datetime.UTC).isoformat()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": f"{metadata['name']}.",
                "namespace": metadata["namespace"],
            },
            "involvedObject": {
                "apiVersion": about["apiVersion"],
                "kind": about["kind"],
                "name": metadata["name"],
                "namespace": metadata["namespace"],
                "uid": metadata.get("uid", ""),
            },
            "type": "Warning" if warning else "Normal",
            "reason": reason,
            "message": message[:1024],
            "source": {"component": REPORTING_COMPONENT},
            "reportingComponent": REPORTING_COMPONENT,
            "reportingInstance": REPORTING_COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        path = RESOURCES["Event"].path(metadata["namespace"])
        try:
            await self._request("POST", path, body=event)
        except ApiError as error:  # events help humans; their loss must not stop a reconcile
            log.warning(f"cannot post event {reason} on {metadata['name']}: {error}")
