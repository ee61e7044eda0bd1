"""A small Kubernetes REST client for the children the operator owns.

kopf watches and patches BatchedModels itself; this client applies (server-side), reads and
deletes the children with the same credentials kopf logged in with (see `handlers.login`).
docs/operator.md says why this is not the `kubernetes` package's client.
"""

from __future__ import annotations

import datetime
import fnmatch
import logging
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf

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

    def path(self, namespace: str, name: str = "", subresource: str = "") -> str:
        root = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        path = f"{root}/namespaces/{namespace}/{self.plural}"
        if name:
            path += f"/{name}"
        if subresource:
            path += f"/{subresource}"
        return path


log = logging.getLogger("carpool_operator.kube")
_PLAIN_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

# Every kind the operator writes, by kind (RBAC in docs/operator.md lists the same).
RESOURCES: dict[str, Resource] = {
    "ConfigMap": Resource("", "v1", "configmaps"),
    "Service": Resource("", "v1", "services"),
    "Deployment": Resource("apps", "v1", "deployments"),
    "PodDisruptionBudget": Resource("policy", "v1", "poddisruptionbudgets"),
    "HorizontalPodAutoscaler": Resource("autoscaling", "v2", "horizontalpodautoscalers"),
    "PodMonitor": Resource("monitoring.coreos.com", "v1", "podmonitors"),
    "BatchedModel": Resource("carpool.dev", "v1alpha1", "batchedmodels"),
    "Event": Resource("", "v1", "events"),
    "Secret": Resource("", "v1", "secrets"),
    "Pod": Resource("", "v1", "pods"),
}
# Asks for metadata only: a Secret's data never reaches the operator.
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
REPORTING_COMPONENT = "carpool-operator"


def _matches(namespace: str, patterns: tuple[str, ...]) -> bool:
    """kopf's namespace patterns: globs, `!glob` to exclude (only exclusions: all else)."""
    excluded = [p[1:] for p in patterns if p.startswith("!")]
    included = [p for p in patterns if not p.startswith("!")] or ["*"]
    return any(fnmatch.fnmatchcase(namespace, p) for p in included) and not any(
        fnmatch.fnmatchcase(namespace, p) for p in excluded
    )


# The API server's answer to an apply it cannot type against the kind's schema (duplicate keys
# in a list merged by key, a field the kind does not declare): a bare 500 with this text
# (k8s.io/apimachinery managedfields, structuredmerge.go). The same request fails the same way.
UNTYPABLE_APPLY = "failed to create typed patch object"
# Retries wait FIRST_RETRY_S (LONG_FIRST_RETRY_S after throttling or a refusal of permission),
# twice as long after each failure in a row, at most MAX_RETRY_S.
FIRST_RETRY_S = 5.0
LONG_FIRST_RETRY_S = 30.0
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
        first = LONG_FIRST_RETRY_S if self.status in (403, 429) else FIRST_RETRY_S
        return min(MAX_RETRY_S, first * 2.0 ** min(retry, 32))


class KubeClient:
    """One aiohttp session against the API server; credentials arrive from kopf's login.

    `on_write` hears the kind of every create, patch and delete the server accepted.
    """

    def __init__(self, on_write: Callable[[str], None] | None = None) -> None:
        self._info: kopf.ConnectionInfo | None = None
        self._session: aiohttp.ClientSession | None = None
        self._on_write = on_write

    def login(self, info: kopf.ConnectionInfo) -> None:
        self._info = info

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> tuple[aiohttp.ClientSession, kopf.ConnectionInfo]:
        if self._info is None:
            raise ApiError(503, "NotLoggedIn", "no credentials yet")
        if self._session is None:
            context: ssl.SSLContext | bool = (
                self._info.as_ssl_context() if self._info.server.startswith("https") else False
            )
            self._session = aiohttp.ClientSession(
                headers={"User-Agent": USER_AGENT},
                connector=aiohttp.TCPConnector(ssl=context),
                timeout=aiohttp.ClientTimeout(total=30),
            )
        return self._session, self._info

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Manifest | None = None,
        content_type: str = "",
        params: dict[str, str] | None = None,
        accept: str = "",
    ) -> Any:
        session, info = self._client()
        # Credentials per request: kopf may log in again (a refreshed token) at any time.
        headers = info.as_http_headers()
        if content_type:
            headers["Content-Type"] = content_type
        if accept:
            headers["Accept"] = accept
        url = info.server.rstrip("/") + path
        try:
            async with session.request(
                method, url, json=body, headers=headers, params=params
            ) as response:
                payload = await response.json(content_type=None)
                if response.status >= 400:
                    reason = message = ""
                    if isinstance(payload, dict):
                        reason = str(payload.get("reason", ""))
                        message = str(payload.get("message", ""))
                    raise ApiError(response.status, reason, message)
                return payload
        except (aiohttp.ClientError, TimeoutError) as error:
            raise ApiError(503, type(error).__name__, str(error)) from error

    async def get(self, kind: str, namespace: str, name: str) -> Manifest | None:
        try:
            found = await self._request("GET", RESOURCES[kind].path(namespace, name))
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return found if isinstance(found, dict) else None

    async def exists(self, kind: str, namespace: str, name: str) -> bool:
        """Whether an object exists, asking for its metadata only."""
        path = RESOURCES[kind].path(namespace, name)
        try:
            await self._request("GET", path, accept=METADATA_ONLY)
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    async def select(self, kind: str, namespace: str, selector: dict[str, str]) -> list[Manifest]:
        """The objects of a kind in a namespace whose labels match `selector`."""
        text = ",".join(f"{key}={value}" for key, value in sorted(selector.items()))
        path = RESOURCES[kind].path(namespace)
        listing = await self._request("GET", path, params={"labelSelector": text})
        return [item for item in listing.get("items", []) if isinstance(item, dict)]

    def _wrote(self, kind: str) -> None:
        if self._on_write is not None:
            self._on_write(kind)

    async def apply(
        self, manifest: Manifest, *, manager: str = FIELD_MANAGER, force: bool = True
    ) -> None:
        """Server-side apply, forced: the child ends up with exactly the fields carpool renders.

        Fields carpool applied before and no longer renders are removed; fields other managers
        own (an HPA's replicas, an injected container) are left alone. Another `manager`, not
        forced, takes part in a hand-over (handover.py): a conflict is then an ApiError 409.
        """
        kind, metadata = manifest["kind"], manifest["metadata"]
        path = RESOURCES[kind].path(metadata["namespace"], metadata["name"])
        params = {"fieldManager": manager}
        if force:
            params["force"] = "true"
        await self._request("PATCH", path, body=manifest, content_type=APPLY_PATCH, params=params)
        self._wrote(kind)

    async def merge_patch(
        self, kind: str, namespace: str, name: str, patch: Manifest, *, subresource: str = ""
    ) -> None:
        path = RESOURCES[kind].path(namespace, name, subresource)
        await self._request("PATCH", path, body=patch, content_type=MERGE_PATCH)
        self._wrote(kind)

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        try:
            await self._request("DELETE", RESOURCES[kind].path(namespace, name))
        except ApiError as error:
            if error.status != 404:
                raise
            return
        self._wrote(kind)

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

    async def list_models(self, namespaces: tuple[str, ...]) -> list[tuple[str, str]]:
        """(namespace, name) of every BatchedModel in `namespaces`, or everywhere if none.

        Plain names are listed one by one (a namespaced operator may list only those); kopf's
        patterns (`team-*`, `!kube-*`) are matched here against a cluster-wide list.
        """
        resource = RESOURCES["BatchedModel"]
        plain = all(_PLAIN_NAMESPACE.match(namespace) for namespace in namespaces)
        if namespaces and plain:
            paths = [resource.path(namespace) for namespace in namespaces]
        else:
            paths = [f"/apis/{resource.group}/{resource.version}/{resource.plural}"]
        found: list[tuple[str, str]] = []
        for path in paths:
            listing = await self._request("GET", path)
            for item in listing.get("items", []):
                metadata = item.get("metadata", {})
                namespace = str(metadata.get("namespace", ""))
                if plain or _matches(namespace, namespaces):
                    found.append((namespace, str(metadata.get("name", ""))))
        return found

    async def serves(self, resource: Resource) -> bool:
        """Whether the cluster serves this resource's group and version (discovery)."""
        try:
            found = await self._request("GET", f"/apis/{resource.group}/{resource.version}")
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        names = [item.get("name") for item in found.get("resources", [])]
        return resource.plural in names
