"""One collection of one kind, kept in memory by a list and then a watch.

As client-go's reflector does: list (the API server filters by label), then watch from the
list's resourceVersion. A watch the server ends or the network drops is resumed from the last
version seen, after a growing pause if it failed or ended at once having said nothing; a 410
Expired (the server no longer keeps that version) means list again. A kind
the cluster does not serve (404: no Prometheus Operator) or the operator may not list (403:
RBAC left it out) holds nothing, says why, and is listed again every `retry_s`.
"""

from __future__ import annotations

import asyncio
import copy
import enum
import logging
from collections.abc import Callable, Mapping
from typing import Any

from carpool_operator.kube import RESOURCES, ApiError, KubeClient
from carpool_operator.types import Manifest

log = logging.getLogger("carpool_operator.informer")
Key = tuple[str, str]  # namespace, name
OnChange = Callable[[str, Manifest], None]  # kind, the object as it now is (or was, if deleted)
# The API server ends each watch after this long; it is then resumed where it ended.
WATCH_SECONDS = 300
# How long a read waits for the first list before it fails (and is retried).
FIRST_LIST_S = 30.0
# Pauses after consecutive failures (a 5xx, a dropped connection), in seconds.
BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
# A watch that ends sooner than this having heard nothing failed (client-go's "very short
# watch"): something between the operator and the API server cuts it, or the server is going
# away. Opened again at once, it would be opened again as fast as the server can answer.
SHORT_WATCH_S = 1.0


class State(enum.Enum):
    LISTING = "listing"  # not listed yet
    LISTED = "listed"
    FORBIDDEN = "forbidden"  # 403: the operator's RBAC does not cover the kind
    ABSENT = "absent"  # 404: the cluster does not serve the kind


def _key(found: Manifest) -> Key:
    metadata = found.get("metadata") or {}
    return str(metadata.get("namespace", "")), str(metadata.get("name", ""))


def _meta(found: Manifest | None, field: str) -> Any:
    return ((found or {}).get("metadata") or {}).get(field)


def _newer(kept: Manifest | None, found: Manifest) -> bool:
    """Whether `kept` is a later version than `found` (when both versions are integers)."""
    versions = str(_meta(kept, "resourceVersion")), str(_meta(found, "resourceVersion"))
    return all(v.isdigit() for v in versions) and int(versions[0]) > int(versions[1])


class Informer:
    """The objects of `kind` in `namespace` (every namespace if empty) that `selector` selects.

    `keep` says which namespaces count (kopf's patterns, for a cluster-wide list); `on_change`
    hears every object a watch event or a new list changed, but not the first list's.
    """

    def __init__(
        self,
        kube: KubeClient,
        kind: str,
        namespace: str,
        selector: str,
        keep: Callable[[str], bool],
        on_change: OnChange,
        retry_s: float,
    ) -> None:
        self.kind = kind
        self.state = State.LISTING
        self.refusal: ApiError | None = None  # why the kind is FORBIDDEN or ABSENT
        self._objects: dict[Key, Manifest] = {}
        self._kube = kube
        self._resource = RESOURCES[kind]
        self._path = self._resource.collection(namespace)
        self._selector = selector
        self._keep = keep
        self._on_change = on_change
        self._retry_s = retry_s
        self._listed = asyncio.Event()  # the first list has an answer, whatever it was

    async def ready(self) -> State:
        """The state once the first list has answered."""
        try:
            await asyncio.wait_for(self._listed.wait(), FIRST_LIST_S)
        except TimeoutError:
            message = f"{self._path} is not listed yet"
            raise ApiError(503, "NotListed", message) from None
        return self.state

    def get(self, namespace: str, name: str) -> Manifest | None:
        found = self._objects.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def select(self, namespace: str, selector: Mapping[str, str]) -> list[Manifest]:
        """The objects in `namespace` whose labels include `selector`."""
        return [
            copy.deepcopy(found)
            for (where, _), found in self._objects.items()
            if where == namespace
            and selector.items() <= ((found.get("metadata") or {}).get("labels") or {}).items()
        ]

    def kept(self) -> list[Key]:
        return list(self._objects)

    def put(self, found: Manifest) -> bool:
        """Keep `found`, unless a later version of the same object is kept already.

        A write's answer may arrive before the watch events that led up to it: those are older
        and must not replace it, or a reconcile could write again, or roll back a spec it has
        just applied. Versions are compared as client-go's integer mutation cache compares
        them: the resourceVersions of one object grow as integers (etcd's revisions); where one
        is not an integer, the later arrival wins.
        """
        key = _key(found)
        if not self._keep(key[0]):
            return False
        kept = self._objects.get(key)
        if _meta(kept, "uid") == _meta(found, "uid") and _newer(kept, found):
            return False
        self._objects[key] = found
        return True

    def forget(self, namespace: str, name: str) -> None:
        self._objects.pop((namespace, name), None)

    async def run(self) -> None:
        """List and watch until cancelled."""
        version, failures, unwatchable = "", 0, False
        while True:
            try:
                if not version:
                    version = await self._list()
                if not version:  # refused: nothing to watch yet
                    await asyncio.sleep(self._retry_s)
                    continue
                started = asyncio.get_running_loop().time()
                resumed = await self._watch(version)
                short = asyncio.get_running_loop().time() - started < SHORT_WATCH_S
                if resumed == version and short:
                    raise ApiError(503, "ShortWatch", "it ended at once, having said nothing")
                version, failures, unwatchable = resumed, 0, False
            except ApiError as error:
                failures += 1
                if error.status in (403, 404, 410):
                    version = ""  # the version is gone, or so is the kind: list again
                pause = BACKOFF_S[min(failures, len(BACKOFF_S)) - 1]
                log.debug(f"watch of {self._path}: {error}; again in {pause}s")
                if error.status == 403 and not unwatchable:  # a list's 403 is _refused's
                    # RBAC with `list` but not `watch`: the cache is as current as the lists
                    # between the pauses, up to the longest; an admin should grant `watch`.
                    log.warning(f"cannot watch {self._path} ({error}); listing it again instead")
                unwatchable = unwatchable or error.status == 403
                await asyncio.sleep(pause)
            except Exception:  # a bug or an answer past belief must not stop the cache for good
                failures, version = failures + 1, ""
                log.exception(f"watch of {self._path} failed; listing again")
                await asyncio.sleep(BACKOFF_S[min(failures, len(BACKOFF_S)) - 1])

    async def _list(self) -> str:
        """Replace the objects by a fresh list; its resourceVersion, or "" when refused."""
        try:
            listing = await self._kube.list(self._path, self._selector)
        except ApiError as error:
            if error.status not in (403, 404):
                raise
            self._refused(error)
            return ""
        fresh: dict[Key, Manifest] = {}
        for item in listing.get("items") or []:
            if not isinstance(item, dict) or not self._keep(_key(item)[0]):
                continue
            # A list's items carry no kind of their own; the watch's objects do.
            item.setdefault("apiVersion", self._resource.api_version)
            item.setdefault("kind", self.kind)
            fresh[_key(item)] = item
        before, self._objects = self._objects, fresh
        relisted = self.state is not State.LISTING
        if self.state is not State.LISTED and relisted:
            log.info(f"{self._path} can be listed now")
        self.state, self.refusal = State.LISTED, None
        self._listed.set()
        if relisted:  # what changed while no watch was looking
            for key, found in fresh.items():
                if _meta(before.get(key), "resourceVersion") != _meta(found, "resourceVersion"):
                    self._on_change(self.kind, found)
            for key, gone in before.items():
                if key not in fresh:
                    self._on_change(self.kind, gone)
        return str((listing.get("metadata") or {}).get("resourceVersion", ""))

    def _refused(self, error: ApiError) -> None:
        state = State.FORBIDDEN if error.status == 403 else State.ABSENT
        if state is not self.state:
            # A kind the cluster lacks is common (PodMonitor without the Prometheus Operator);
            # one the operator may not list is an admin's choice or oversight: both are said.
            level = logging.WARNING if state is State.FORBIDDEN else logging.INFO
            log.log(level, f"cannot list {self._path} ({error}); trying every {self._retry_s}s")
        self.state, self.refusal = state, error
        self._objects.clear()
        self._listed.set()

    async def _watch(self, version: str) -> str:
        """Apply a watch's events from `version`; the last version seen, when it ends."""
        params = {"resourceVersion": version, "timeoutSeconds": str(WATCH_SECONDS)}
        if self._selector:
            params["labelSelector"] = self._selector
        async for event in self._kube.watch(self._path, params):
            found = event.get("object")
            if not isinstance(found, dict):
                continue
            if event.get("type") == "ERROR":  # a meta/v1 Status: 410 Expired, mostly
                code = int(found.get("code") or 500)
                raise ApiError(code, str(found.get("reason", "")), str(found.get("message", "")))
            version = str(_meta(found, "resourceVersion") or version)
            if event.get("type") == "DELETED":
                kept = self._objects.get(_key(found))
                if kept is None or _meta(kept, "uid") != _meta(found, "uid"):
                    continue  # not kept, or already replaced by a newer object of that name
                self.forget(*_key(found))
            elif event.get("type") not in ("ADDED", "MODIFIED") or not self.put(found):
                continue
            self._on_change(self.kind, found)
        return version
