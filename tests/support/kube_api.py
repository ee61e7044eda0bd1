"""A Kubernetes API server for tests, on kmock's KubernetesEmulator, served on 127.0.0.1.

Good enough for the real kopf operator, kubectl and (with the gaps below) helm. Start it with
`ServedKubeApi` (a thread with its own event loop, so that tests may block on subprocesses) and
point clients at it with `ServedKubeApi.write_kubeconfig(path)`::

    with ServedKubeApi() as served:
        kubeconfig = served.write_kubeconfig(tmp_path / "kubeconfig")
        subprocess.run([kubectl, "--kubeconfig", kubeconfig, "apply", "-f", crd_path], ...)
        served.api.write_count(agent="carpool-operator")
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime
import itertools
import json
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import attrs
import kmock
import yaml
from aiohttp import web

from carpool_operator.schema import Cause, apply_defaults, prune, validate
from support import kube_apply, kube_scale, kube_typed
from support import kube_protobuf as protobuf
from support import kube_rbac as rbac
from support.crd_validation import validate_crd
from support.kube_defaults import apply_builtin_defaults
from support.kube_patch import PatchError, json_patch, merge_patch, strategic_merge_patch
from support.kube_tables import table

Json = dict[str, Any]
KindKey = tuple[str, str, str]  # group, version, plural
ObjectKey = tuple[KindKey, str, str]  # kind, namespace ("" when cluster-scoped), name
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# What an orphaning delete holds its object with until the garbage collector has orphaned the
# dependents, and the field manager of that collector's writes.
ORPHAN_FINALIZER = "orphan"
GC_MANAGER = "kube-controller-manager"
PROTOBUF = "application/vnd.kubernetes.protobuf"
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    status: bool = False  # has a status subresource
    scale: bool = False  # has a scale subresource (kube_scale)
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    schema: Json | None = None  # a CRD's openAPIV3Schema
    columns: tuple[Json, ...] = ()  # a CRD's additionalPrinterColumns

    @property
    def key(self) -> KindKey:
        return (self.group, self.version, self.plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


BUILTIN_KINDS = (
    Kind("", "v1", "namespaces", "Namespace", namespaced=False, status=True, short_names=("ns",)),
    Kind("", "v1", "configmaps", "ConfigMap", short_names=("cm",)),
    Kind("", "v1", "secrets", "Secret"),
    Kind("", "v1", "services", "Service", status=True, short_names=("svc",)),
    Kind("", "v1", "serviceaccounts", "ServiceAccount", short_names=("sa",)),
    Kind("", "v1", "pods", "Pod", status=True, short_names=("po",)),
    Kind("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", status=True),
    Kind("", "v1", "events", "Event", short_names=("ev",)),
    Kind(
        "apps", "v1", "deployments", "Deployment", status=True, scale=True, short_names=("deploy",)
    ),
    Kind("apps", "v1", "replicasets", "ReplicaSet", status=True, short_names=("rs",)),
    Kind(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        status=True,
        short_names=("pdb",),
    ),
    Kind(
        "autoscaling",
        "v2",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        status=True,
        short_names=("hpa",),
    ),
    Kind("events.k8s.io", "v1", "events", "Event", short_names=("ev",)),
    Kind("coordination.k8s.io", "v1", "leases", "Lease"),
    Kind("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    Kind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    Kind("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    Kind(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        namespaced=False,
    ),
    Kind(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
        status=True,
        short_names=("crd",),
    ),
)
CRD_KEY: KindKey = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")


class ApiFailure(Exception):
    """An error answer, rendered as a meta/v1 Status like a real API server's."""

    def __init__(self, code: int, reason: str, message: str, details: Json | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> Json:
        status: Json = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        }
        if self.reason:  # an error the API server does not know is answered without one
            status["reason"] = self.reason
        if self.details:
            status["details"] = self.details
        return status


def _not_found(kind: Kind, name: str) -> ApiFailure:
    details = {"name": name, "group": kind.group, "kind": kind.plural}
    return ApiFailure(404, "NotFound", f'{kind.qualified} "{name}" not found', details)


def _dotted(obj: Json, path: str) -> Any:
    """A field selector's value: `involvedObject.name` -> obj["involvedObject"]["name"]."""
    node: Any = obj
    for part in path.split("."):
        node = node.get(part, "") if isinstance(node, dict) else ""
    return node


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Target:
    """What a resource URL names."""

    group: str
    version: str
    plural: str = ""
    namespace: str = ""
    name: str = ""
    subresource: str = ""


def parse_target(path: str) -> Target | None:
    parts = [part for part in path.split("/") if part]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    padded = [*rest, "", "", ""]
    return Target(group, version, padded[0], namespace, padded[1], "/".join(rest[2:]))


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str  # "=", "!=", "in", "notin", "exists", "!"
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator == "exists":
            return value is not None
        if self.operator == "!":
            return value is None
        if self.operator in ("=", "in"):
            return value in self.values
        return value not in self.values


def parse_selector(text: str) -> list[Requirement]:
    """Label selectors: k=v, k==v, k!=v, k, !k, k in (a,b), k notin (a,b)."""
    requirements: list[Requirement] = []
    depth, start, pieces = 0, 0, []
    for index, char in enumerate(text):
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            pieces.append(text[start:index])
            start = index + 1
    pieces.append(text[start:])
    for piece in (piece.strip() for piece in pieces if piece.strip()):
        for word, operator in ((" notin ", "notin"), (" in ", "in")):
            if word in piece:
                key, _, values = piece.partition(word)
                names = frozenset(v.strip() for v in values.strip(" ()").split(","))
                requirements.append(Requirement(key.strip(), operator, names))
                break
        else:
            if "!=" in piece:
                key, _, value = piece.partition("!=")
                requirements.append(Requirement(key.strip(), "!=", frozenset({value.strip()})))
            elif "=" in piece:
                key, _, value = piece.replace("==", "=").partition("=")
                requirements.append(Requirement(key.strip(), "=", frozenset({value.strip()})))
            elif piece.startswith("!"):
                requirements.append(Requirement(piece[1:].strip(), "!"))
            else:
                requirements.append(Requirement(piece, "exists"))
    return requirements


@dataclass
class Watcher:
    kind: KindKey
    namespace: str
    matches: Callable[[Json], bool]
    queue: asyncio.Queue[Json] = field(default_factory=asyncio.Queue)


@dataclass(frozen=True)
class Record:
    """One request, for assertions: who did what to which path."""

    method: str
    path: str
    agent: str
    content_type: str
    query: str = ""
    # The name of the object a write is about: the path's, a created object's, or an event's
    # involved object's.
    subject: str = ""


def _subject(path: str, data: Any) -> str:
    body = data if isinstance(data, dict) else {}
    for reference in ("involvedObject", "regarding"):  # an event (core/v1, events/v1)
        if isinstance(named := body.get(reference), dict) and "name" in named:
            return str(named["name"])
    segments = path.strip("/").split("/")
    if "namespaces" in segments:
        after = segments[segments.index("namespaces") + 1 :]
        if len(after) >= 3:  # namespace, plural, name[, subresource]
            return after[2]
    metadata = body.get("metadata")
    return str(metadata.get("name", "")) if isinstance(metadata, dict) else ""


@dataclass
class Failure:
    """An injected error: the next `times` requests matching method and path get it."""

    method: str
    path: str
    code: int
    times: int


@attrs.define(kw_only=True)
class KubeApiServer(kmock.KubernetesEmulator):
    """kmock's KubernetesEmulator, completed where kopf, kubectl and helm need more.

    Added over the stock emulator: objects get uid, resourceVersion (one cluster-wide counter),
    generation (bumped when anything outside metadata and status changes) and creationTimestamp;
    lists carry kind and resourceVersion; watches honour `?resourceVersion=` (replaying the
    event history after it, so nothing is lost between a list and its watch), `labelSelector`
    (an object whose labels stop matching is DELETED, one whose labels start matching ADDED),
    `fieldSelector` (equality on dotted paths) and `timeoutSeconds`; PUT; merge, JSON and
    (approximated, see kube_patch) strategic merge patches; server-side apply with field ownership
    (`managedFields`, conflicts, `force`, removal of fields a manager stops applying; see
    kube_apply) and its refusal, with a bare 500, of a built-in object it cannot type against
    Kubernetes' schema (duplicate keys in a list merged by key, an undeclared field; see
    kube_typed); no-op writes do not bump resourceVersion; a status subresource split for
    kinds that have one (writes to the object ignore `.status`, writes to `/status` change only
    `.status`); finalizers and deletionTimestamp; ownerReference garbage collection (at once,
    or `gc_delay_s` later as from a real, lagging collector; cascading, background-style; a
    dependent created, or given its references, after its owners are gone goes too; an
    orphaning delete, `propagationPolicy: Orphan`, marks the owner with the `orphan`
    finalizer, and the collector then takes the owner's reference off its dependents and
    removes the finalizer); a resourceVersion in a patch or an applied configuration is a
    precondition, as in an update;
    discovery (`/api`, `/apis`, each group and version) including
    CRDs once applied; a CRD is validated as the API server validates it (its name, names,
    versions, printer columns and schema: structural, defaults, list and map types, CEL rules and
    their fieldPaths; see crd_validation) and refused with the same 422 and field causes, then
    becomes Established at once; custom resources are defaulted, pruned
    (or rejected under `fieldValidation=Strict`) and validated against their CRD's structural
    schema including its CEL rules (see carpool_operator.schema); a few API-server defaults of
    Deployments and Services (see kube_defaults), so that clients can prove they compare only
    their own fields; server-side Tables for `kubectl get`, with a CRD's printer columns;
    `dryRun`; and a log of requests (`records`, `write_count`); injected errors (`fail`);
    protobuf request bodies of Secrets and ConfigMaps (helm's release storage; see
    kube_protobuf).

    Authentication and authorization for ServiceAccounts a test gives a token
    (`service_account_token`): their requests are authorized by the stored Roles,
    ClusterRoles and bindings as the RBAC authorizer does (see kube_rbac) and refused with the
    API server's 403; any other token may do anything.

    Still unlike a real API server: no other authentication, no admission webhooks,
    quotas or namespace lifecycle (objects may land in namespaces that do not exist); no
    controllers (Deployments never get pods or status unless a test writes it); built-in kinds
    are stored as sent, without schema validation or pruning (apply's typed conversion
    aside); CEL rules other than the known ones are ignored; `/openapi/v3` holds only each
    kind's PATCH operation with its `fieldValidation` parameter (enough for kubectl to leave
    validation to the server) and no schemas, and there is no `/openapi/v2`, so kubectl's
    client-side strategic merge falls back to its compiled-in types; no other protobuf, no
    aggregated discovery (clients fall back to the legacy documents), no deletecollection,
    `/scale` only for Deployments (see kube_scale; get, update and merge patch), no watch
    bookmarks, no 410 Gone until a test calls `compact` (the whole history is kept); Tables of
    built-in kinds show only Name and Age; a metadata-only GET (`as=PartialObjectMetadata`) gets
    the whole object.
    """

    kinds: dict[KindKey, Kind] = attrs.field(init=False, factory=dict)
    store: dict[ObjectKey, Json] = attrs.field(init=False, factory=dict)
    records: list[Record] = attrs.field(init=False, factory=list)
    _revision: itertools.count[int] = attrs.field(init=False, factory=lambda: itertools.count(2))
    # Each write's revision, kind, event and the object as it was before (None if new).
    _history: list[tuple[int, KindKey, Json, Json | None]] = attrs.field(init=False, factory=list)
    _watchers: list[Watcher] = attrs.field(init=False, factory=list)
    _failures: list[Failure] = attrs.field(init=False, factory=list)
    _users: dict[str, str] = attrs.field(init=False, factory=dict)  # bearer token: user
    _compacted: int = attrs.field(init=False, default=0)  # history up to here is forgotten
    # How long after an owner goes the garbage collector deletes its dependents: a real one
    # works in the background, from its own watches (0: at once).
    gc_delay_s: float = attrs.field(init=False, default=0.0)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for kind in BUILTIN_KINDS:
            self.kinds[kind.key] = kind
        for namespace in ("default", "kube-system"):
            self._create(self.kinds["", "v1", "namespaces"], "", {"metadata": {"name": namespace}})

    # ---- for tests --------------------------------------------------------------------------

    def write_count(self, *, agent: str = "", about: str | None = None) -> int:
        """Write requests so far (POST, PUT, PATCH, DELETE) whose User-Agent contains `agent`;
        `about`: only those about the object of that name or its children (`about-...`)."""
        return sum(
            1
            for r in list(self.records)
            if r.method in WRITE_METHODS
            and agent in r.agent
            and (about is None or r.subject == about or r.subject.startswith(f"{about}-"))
        )

    def request_count(self, method: str, path: str, *, agent: str = "") -> int:
        return sum(
            1
            for r in list(self.records)
            if r.method == method and r.path == path and agent in r.agent
        )

    def fail(self, method: str, path: str, *, code: int = 500, times: int = 1) -> None:
        """Answer the next `times` requests of `method` to exactly `path` with `code`."""
        self._failures.append(Failure(method, path, code, times))

    def service_account_token(self, namespace: str, name: str) -> str:
        """A bearer token for a ServiceAccount, whose requests RBAC then authorizes.

        Requests with any other token are the test's own and are allowed everything.
        """
        token = f"{namespace}-{name}-{uuid.uuid4().hex}"
        self._users[token] = f"{rbac.SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"
        return token

    def compact(self) -> None:
        """Forget the event history, as etcd's compaction does: a watch from an older version
        is told 410 Expired and must list again."""
        self._compacted = self._current_revision()
        self._history.clear()

    def serve_kind(self, kind: Kind) -> None:
        """Declare an API the cluster serves, e.g. monitoring.coreos.com's PodMonitor."""
        self.kinds[kind.key] = kind

    # ---- HTTP -------------------------------------------------------------------------------

    async def __call__(self, raw_request: web.BaseRequest) -> web.StreamResponse:
        # kmock's own URL parsing fails on cluster-scoped collections (/api/v1/namespaces), so
        # requests are built here; routing below reads only the HTTP parts of them.
        body = await raw_request.read()
        text = body.decode("utf-8", errors="replace")
        try:
            data = json.loads(text) if text else None
        except ValueError:
            data = None
        request = kmock.Request(
            id=len(self.records),
            raw_request=raw_request,
            method=raw_request.method,
            url=raw_request.url,
            params=dict(raw_request.query),
            headers=dict(raw_request.headers),
            body=body,
            text=text,
            data=data,
        )
        try:
            return await self._handle(request)
        except Exception as error:  # a bug here should reach the client as a 500, not a hang
            return await self._render_error(error)

    async def _handle(self, request: kmock.Request) -> web.StreamResponse:
        method = str(request.method.value).upper()
        headers = {key.lower(): value for key, value in request.headers.items()}
        self.records.append(
            Record(
                method,
                request.url.path,
                headers.get("user-agent", ""),
                headers.get("content-type", ""),
                request.url.query_string,
                _subject(request.url.path, request.data),
            )
        )
        try:
            self._authorize(request, method, headers)
            self._injected_failure(method, request.url.path)
            status, payload = self._route(request, method, headers)
        except ApiFailure as failure:
            status, payload = failure.code, failure.status()
        except PatchError as error:
            failure = ApiFailure(
                error.status, "Invalid" if error.status == 422 else "BadRequest", str(error)
            )
            status, payload = failure.code, failure.status()
        return await kmock.Response(status=status, payload=payload)(request)

    def _authorize(self, request: kmock.Request, method: str, headers: dict[str, str]) -> None:
        """RBAC, for the users `service_account_token` made; the test itself may do anything."""
        token = headers.get("authorization", "").removeprefix("Bearer ").strip()
        user = self._users.get(token)
        target = parse_target(request.url.path.rstrip("/"))
        if user is None or target is None or not target.plural:
            return  # discovery and /version are open to every authenticated user
        params = dict(request.params)
        attributes = rbac.Attributes(
            user,
            rbac.verb(method, bool(target.name), params),
            target.group,
            target.plural,
            target.subresource,
            target.namespace,
            target.name or rbac.listed_name(params),
        )
        checks = [attributes]
        kind = self.kinds.get((target.group, target.version, target.plural))
        applying = headers.get("content-type", "").startswith("application/apply-patch")
        if applying and kind is not None:
            key: ObjectKey = (kind.key, target.namespace if kind.namespaced else "", target.name)
            if key not in self.store:  # an apply that creates is authorized as create too
                checks.append(dataclasses.replace(attributes, verb="create"))
        group = "rbac.authorization.k8s.io"
        roles = {
            (namespace, name): obj
            for (kind_key, namespace, name), obj in self.store.items()
            if kind_key in ((group, "v1", "roles"), (group, "v1", "clusterroles"))
        }
        bindings = [
            obj
            for (kind_key, _, _), obj in self.store.items()
            if kind_key in ((group, "v1", "rolebindings"), (group, "v1", "clusterrolebindings"))
        ]
        for check in checks:
            if not rbac.allowed(check, roles, bindings):
                details = {"name": check.name, "group": check.group, "kind": check.resource}
                raise ApiFailure(403, "Forbidden", rbac.forbidden_message(check), details)

    def _injected_failure(self, method: str, path: str) -> None:
        for failure in self._failures:
            if failure.times > 0 and (failure.method, failure.path) == (method, path):
                failure.times -= 1
                raise ApiFailure(failure.code, "InternalError", "injected by the test")

    def _route(
        self, request: kmock.Request, method: str, headers: dict[str, str]
    ) -> tuple[int, Any]:
        path = request.url.path.rstrip("/") or "/"
        params = dict(request.params)
        content_type = headers.get("content-type", "").split(";")[0].strip()
        if content_type == "application/apply-patch+yaml" and not params.get("fieldManager"):
            raise ApiFailure(
                400, "BadRequest", "PATCH, application/apply-patch+yaml: fieldManager is required"
            )
        # Without ?fieldManager= the API server names the manager after the User-Agent.
        agent = headers.get("user-agent", "")
        params.setdefault("fieldManager", agent.split("/")[0] or "unknown")
        if path == "/version":
            major, minor = kube_typed.VERSION.split(".")
            return 200, {
                "major": major,
                "minor": minor,
                "gitVersion": f"v{kube_typed.VERSION}.0",
                "platform": "linux/amd64",
            }
        if path == "/api":
            return 200, {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [],
            }
        if path == "/apis":
            return 200, self._group_list()
        if path == "/openapi/v3":
            return 200, self._openapi_index()
        if path.startswith("/openapi/v3/"):
            return 200, self._openapi_document(path.removeprefix("/openapi/v3/"))
        target = parse_target(path)
        if target is None:
            raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
        if not target.plural:
            return 200, self._discover(target)
        kind = self.kinds.get((target.group, target.version, target.plural))
        if kind is None:
            raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
        namespace = target.namespace if kind.namespaced else ""
        wants_table = "as=Table" in headers.get("accept", "")
        if method == "GET" and params.get("watch") in ("true", "1"):
            return 200, self._watch(kind, namespace, params, target.name)
        if method == "GET" and not target.name:
            listing = self._list(kind, namespace, params)
            if wants_table:
                return 200, table(listing["items"], list(kind.columns), "v1")
            return 200, listing
        if method == "POST" and not target.name:
            return 201, self._create(kind, namespace, self._body(request, headers), params)
        if not target.name:
            raise ApiFailure(405, "MethodNotAllowed", f"{method} is not supported on collections")
        key: ObjectKey = (kind.key, namespace, target.name)
        if target.subresource == kube_scale.SUBRESOURCE and kind.scale:
            return 200, self._scale(kind, key, method, self._body(request, headers), params)
        if method == "GET":
            found = self._existing(kind, key)
            if wants_table:
                return 200, table([found], list(kind.columns), "v1")
            return 200, found
        if method == "PUT":
            body = self._body(request, headers)
            return 200, self._update(kind, key, body, target.subresource, params, replace=True)
        if method == "PATCH":
            return self._patch(kind, key, request, headers, target.subresource, params)
        if method == "DELETE":
            # DeleteOptions in JSON (kubectl's); helm's in protobuf are not read.
            protobuf_body = headers.get("content-type", "").startswith(PROTOBUF)
            options = {} if protobuf_body else self._body(request, headers)
            if isinstance(options, dict) and options.get("propagationPolicy"):
                params.setdefault("propagationPolicy", str(options["propagationPolicy"]))
            if isinstance(options, dict) and isinstance(options.get("preconditions"), dict):
                self._check_preconditions(kind, key, options["preconditions"])
            return 200, self._delete(kind, key, params)
        raise ApiFailure(405, "MethodNotAllowed", f"{method} is not supported")

    @staticmethod
    def _body(request: kmock.Request, headers: dict[str, str]) -> Any:
        if headers.get("content-type", "").startswith(PROTOBUF):
            try:
                return protobuf.decode(request.body)
            except (ValueError, IndexError, UnicodeDecodeError) as error:
                raise ApiFailure(415, "UnsupportedMediaType", str(error)) from error
        if isinstance(request.data, dict | list):
            return request.data
        try:
            return yaml.safe_load(request.text) if request.text else {}
        except yaml.YAMLError as error:
            raise ApiFailure(400, "BadRequest", f"cannot decode the body: {error}") from error

    # ---- discovery --------------------------------------------------------------------------

    def _group_list(self) -> Json:
        groups: dict[str, list[str]] = {}
        for kind in self.kinds.values():
            if kind.group and kind.version not in groups.setdefault(kind.group, []):
                groups[kind.group].append(kind.version)
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [self._group(name, versions) for name, versions in sorted(groups.items())],
        }

    @staticmethod
    def _group(name: str, versions: list[str]) -> Json:
        entries = [
            {"groupVersion": f"{name}/{version}", "version": version} for version in versions
        ]
        return {"name": name, "versions": entries, "preferredVersion": entries[0]}

    def _discover(self, target: Target) -> Json:
        if not target.version and target.group:
            versions = [k.version for k in self.kinds.values() if k.group == target.group]
            if not versions:
                raise ApiFailure(
                    404, "NotFound", "the server could not find the requested resource"
                )
            return {
                "kind": "APIGroup",
                "apiVersion": "v1",
                **self._group(target.group, sorted(set(versions))),
            }
        kinds = [
            k for k in self.kinds.values() if (k.group, k.version) == (target.group, target.version)
        ]
        if not kinds:
            # /apis/GROUP arrives here as group=GROUP with the version slot empty: handled above.
            raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
        resources: list[Json] = []
        for kind in kinds:
            resources.append(
                {
                    "name": kind.plural,
                    "singularName": kind.kind.lower(),
                    "namespaced": kind.namespaced,
                    "kind": kind.kind,
                    "verbs": VERBS,
                    "shortNames": list(kind.short_names),
                    "categories": list(kind.categories),
                }
            )
            if kind.status:
                resources.append(
                    {
                        "name": f"{kind.plural}/status",
                        "singularName": "",
                        "namespaced": kind.namespaced,
                        "kind": kind.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if kind.scale:
                group, version = kube_scale.API_VERSION.split("/")
                resources.append(
                    {
                        "name": f"{kind.plural}/{kube_scale.SUBRESOURCE}",
                        "singularName": "",
                        "namespaced": kind.namespaced,
                        "group": group,
                        "version": version,
                        "kind": "Scale",
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": kinds[0].api_version,
            "resources": resources,
        }

    # ---- OpenAPI v3: just enough for kubectl to trust server-side field validation -------

    def _openapi_index(self) -> Json:
        versions = {(kind.group, kind.version) for kind in self.kinds.values()}
        paths = {}
        for group, version in sorted(versions):
            name = f"apis/{group}/{version}" if group else f"api/{version}"
            paths[name] = {
                "serverRelativeURL": f"/openapi/v3/{name}?hash={self._current_revision()}"
            }
        return {"paths": paths}

    def _openapi_document(self, name: str) -> Json:
        """Each kind's PATCH operation with its fieldValidation parameter; no schemas."""
        target = parse_target("/" + name)
        if target is None:
            raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
        paths: Json = {}
        for kind in self.kinds.values():
            if (kind.group, kind.version) != (target.group, target.version):
                continue
            root = f"/apis/{kind.group}/{kind.version}" if kind.group else f"/api/{kind.version}"
            scope = "/namespaces/{namespace}" if kind.namespaced else ""
            paths[f"{root}{scope}/{kind.plural}/{{name}}"] = {
                "patch": {
                    "parameters": [
                        {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}
                    ],
                    "responses": {"200": {"description": "OK"}},
                    "x-kubernetes-action": "patch",
                    "x-kubernetes-group-version-kind": {
                        "group": kind.group,
                        "version": kind.version,
                        "kind": kind.kind,
                    },
                }
            }
        if not paths:
            raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": f"v{kube_typed.VERSION}.0"},
            "paths": paths,
        }

    # ---- reading ----------------------------------------------------------------------------

    def _existing(self, kind: Kind, key: ObjectKey) -> Json:
        found = self.store.get(key)
        if found is None:
            raise _not_found(kind, key[2])
        return copy.deepcopy(found)

    def _matcher(
        self, namespace: str, params: dict[str, str], name: str = ""
    ) -> Callable[[Json], bool]:
        requirements = parse_selector(params.get("labelSelector", ""))
        fields = dict(
            piece.replace("==", "=").split("=", 1)
            for piece in params.get("fieldSelector", "").split(",")
            if "=" in piece
        )
        if name:
            fields["metadata.name"] = name
        if namespace:
            fields["metadata.namespace"] = namespace

        def matches(obj: Json) -> bool:
            labels = obj.get("metadata", {}).get("labels") or {}
            return all(str(_dotted(obj, path)) == value for path, value in fields.items()) and all(
                requirement.matches(labels) for requirement in requirements
            )

        return matches

    def _list(self, kind: Kind, namespace: str, params: dict[str, str]) -> Json:
        matches = self._matcher(namespace, params)
        items = [
            copy.deepcopy(obj)
            for (key, _, _), obj in sorted(self.store.items())
            if key == kind.key and matches(obj)
        ]
        return {
            "kind": f"{kind.kind}List",
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(self._current_revision())},
            "items": items,
        }

    def _current_revision(self) -> int:
        return self._history[-1][0] if self._history else max(self._compacted, 1)

    def _watch(
        self, kind: Kind, namespace: str, params: dict[str, str], name: str
    ) -> AsyncIterator[Any]:
        matches = self._matcher(namespace, params, name)
        since = params.get("resourceVersion", "")
        if since and since != "0" and int(since) < self._compacted:
            return self._expired(since)
        if since and since != "0":
            backlog = [
                seen
                for revision, key, event, previous in self._history
                if key == kind.key
                and revision > int(since)
                and (seen := _seen(event, previous, matches)) is not None
            ]
        else:
            listing = self._list(kind, namespace, params)
            backlog = [{"type": "ADDED", "object": obj} for obj in listing["items"] if matches(obj)]
        # Registered before any await: no write can slip between the backlog and the queue.
        watcher = Watcher(kind.key, namespace, matches)
        self._watchers.append(watcher)
        timeout = float(params.get("timeoutSeconds") or 1800)

        async def stream() -> AsyncIterator[Any]:
            try:
                yield b""  # sends the headers now: a quiet watch is still a watch
                for event in backlog:
                    yield event
                deadline = asyncio.get_running_loop().time() + timeout
                while (remaining := deadline - asyncio.get_running_loop().time()) > 0:
                    try:
                        yield await asyncio.wait_for(watcher.queue.get(), remaining)
                    except TimeoutError:
                        break
            finally:
                self._watchers.remove(watcher)

        return stream()

    async def _expired(self, since: str) -> AsyncIterator[Any]:
        """A watch from a forgotten version: 200, then one ERROR event, as the API server says
        it (410 Expired); the client must list again."""
        yield b""
        message = f"too old resource version: {since} ({self._current_revision()})"
        yield {"type": "ERROR", "object": ApiFailure(410, "Expired", message).status()}

    # ---- writing ----------------------------------------------------------------------------

    def _emit(self, kind: Kind, event_type: str, obj: Json, previous: Json | None = None) -> None:
        """Tell the watches of a write; `previous`: the object before it (None if new)."""
        revision = int(obj["metadata"]["resourceVersion"])
        event = {"type": event_type, "object": copy.deepcopy(obj)}
        before = copy.deepcopy(previous)
        self._history.append((revision, kind.key, event, before))
        for watcher in self._watchers:
            if watcher.kind == kind.key and (seen := _seen(event, before, watcher.matches)):
                watcher.queue.put_nowait(seen)

    def _admit(self, kind: Kind, obj: Json, params: dict[str, str]) -> None:
        """Defaults, pruning and validation: what the API server does before storing."""
        apply_builtin_defaults(kind.kind, obj)
        if kind.key == CRD_KEY and (causes := validate_crd(obj)):
            raise self._invalid(kind, obj["metadata"].get("name", ""), causes)
        if kind.schema is None:
            return
        apply_defaults(obj, kind.schema)
        unknown = prune(obj, kind.schema)
        if unknown and params.get("fieldValidation") == "Strict":
            fields = ", ".join(f'unknown field "{path}"' for path in unknown)
            raise ApiFailure(
                400,
                "BadRequest",
                f'{kind.kind} in version "{kind.version}" cannot be handled as a {kind.kind}: '
                f"strict decoding error: {fields}",
            )
        causes = validate(obj, kind.schema)
        if causes:
            raise self._invalid(kind, obj["metadata"].get("name", ""), causes)

    @staticmethod
    def _invalid(kind: Kind, name: str, causes: list[Cause]) -> ApiFailure:
        # One line per distinct error, as the API server's aggregate of them.
        texts = list(dict.fromkeys(f"{cause.field}: {cause.message}" for cause in causes))
        summary = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
        details = {
            "name": name,
            "group": kind.group,
            "kind": kind.kind,
            "causes": [
                {"reason": cause.reason, "message": cause.message, "field": cause.field}
                for cause in causes
            ],
        }
        message = f'{kind.kind}.{kind.group or "core"} "{name}" is invalid: {summary}'
        return ApiFailure(422, "Invalid", message, details)

    def _create(
        self, kind: Kind, namespace: str, body: Any, params: dict[str, str] | None = None
    ) -> Json:
        params = params or {}
        if not isinstance(body, dict):
            raise ApiFailure(400, "BadRequest", "the body is not an object")
        obj = copy.deepcopy(body)
        metadata = obj.setdefault("metadata", {})
        if kind.namespaced:
            namespace = namespace or metadata.get("namespace") or "default"
            if (metadata.get("namespace") or namespace) != namespace:
                raise ApiFailure(
                    400, "BadRequest", "the namespace of the object does not match the URL"
                )
            metadata["namespace"] = namespace
        else:
            metadata.pop("namespace", None)
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]
        name = metadata.get("name")
        if not name:
            raise ApiFailure(
                422, "Invalid", "metadata.name: Required value: name or generateName is required"
            )
        key: ObjectKey = (kind.key, namespace if kind.namespaced else "", name)
        if key in self.store:
            details = {"name": name, "group": kind.group, "kind": kind.plural}
            raise ApiFailure(
                409, "AlreadyExists", f'{kind.qualified} "{name}" already exists', details
            )
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        if kind.status and kind.key != CRD_KEY:
            obj.pop("status", None)
        for transient in ("uid", "resourceVersion", "deletionTimestamp", "generation"):
            metadata.pop(transient, None)
        metadata.pop("managedFields", None)
        sent = copy.deepcopy(obj)
        self._admit(kind, obj, params)
        manager = params.get("fieldManager", "unknown")
        if params.get("apply"):
            # An apply owns what it applied, not what defaulting added to it (a plain create
            # owns its defaults too: the API server defaults while decoding the body).
            owned = kube_apply.apply({"metadata": {}}, sent, manager, force=True)
            metadata["managedFields"] = owned["metadata"]["managedFields"]
        else:
            kube_apply.update(None, obj, manager)
        metadata.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        if kind.key == CRD_KEY:
            self._establish(obj)
        if params.get("dryRun"):
            return obj
        metadata["resourceVersion"] = str(next(self._revision))
        self.store[key] = obj
        self._emit(kind, "ADDED", obj)
        created = copy.deepcopy(obj)
        self._collect_if_dangling(key, obj)
        return created

    def _update(
        self,
        kind: Kind,
        key: ObjectKey,
        body: Any,
        subresource: str,
        params: dict[str, str],
        *,
        replace: bool,
        applied: bool = False,
    ) -> Json:
        """`applied`: `body` is the result of a server-side apply, its managedFields set."""
        old = self._existing(kind, key)
        if not isinstance(body, dict):
            raise ApiFailure(400, "BadRequest", "the body is not an object")
        # The version a client sent (a patch's result keeps the stored one unless the patch
        # names another) is a precondition of any write.
        sent_version = body.get("metadata", {}).get("resourceVersion")
        if sent_version and sent_version != old["metadata"]["resourceVersion"]:
            message = (
                f'Operation cannot be fulfilled on {kind.qualified} "{key[2]}": the object has '
                "been modified; please apply your changes to the latest version and try again"
            )
            raise ApiFailure(409, "Conflict", message)
        new = copy.deepcopy(body)
        if subresource == "status":
            new = {**old, "status": new.get("status")}
            if new["status"] is None:
                del new["status"]
        elif subresource and not (subresource == kube_scale.SUBRESOURCE and kind.scale):
            raise ApiFailure(404, "NotFound", f"subresource {subresource} is not served")
        elif kind.status and kind.key != CRD_KEY:
            new.pop("status", None)
            if "status" in old:
                new["status"] = old["status"]
        metadata = new.setdefault("metadata", {})
        for fixed in (
            "uid",
            "creationTimestamp",
            "name",
            "namespace",
            "deletionTimestamp",
            "generation",
        ):
            if fixed in old["metadata"]:
                metadata[fixed] = old["metadata"][fixed]
            else:
                metadata.pop(fixed, None)
        metadata["resourceVersion"] = old["metadata"]["resourceVersion"]
        new["apiVersion"], new["kind"] = kind.api_version, kind.kind
        self._admit(kind, new, params)
        if not applied:
            # Managed fields are the server's: what a client sends there is ignored here.
            metadata["managedFields"] = old["metadata"].get("managedFields", [])
            manager = params.get("fieldManager", "unknown")
            kube_apply.update(old, new, manager, subresource=subresource)
        if kind.key == CRD_KEY:
            self._establish(new)

        def essence(obj: Json) -> Json:
            return {k: v for k, v in obj.items() if k not in ("metadata", "status")}

        if essence(new) != essence(old):
            metadata["generation"] = int(old["metadata"].get("generation", 1)) + 1
        if _timeless(new) == _timeless(old) or params.get("dryRun"):
            return old  # a no-op write changes nothing, not even the resourceVersion
        metadata["resourceVersion"] = str(next(self._revision))
        if metadata.get("deletionTimestamp") and not metadata.get("finalizers"):
            self._remove(kind, key, new)
            return new
        self.store[key] = new
        self._emit(kind, "MODIFIED", new, old)
        updated = copy.deepcopy(new)
        self._collect_if_dangling(key, new)
        return updated

    def _patch(
        self,
        kind: Kind,
        key: ObjectKey,
        request: kmock.Request,
        headers: dict[str, str],
        subresource: str,
        params: dict[str, str],
    ) -> tuple[int, Json]:
        content_type = headers.get("content-type", "").split(";")[0].strip()
        body = self._body(request, headers)
        if content_type == "application/apply-patch+yaml":
            return self._apply(kind, key, body, subresource, params)
        old = self._existing(kind, key)
        if content_type == "application/json-patch+json":
            patched = json_patch(old, body)
        elif content_type == "application/strategic-merge-patch+json":
            if kind.schema is not None:
                raise ApiFailure(
                    415,
                    "UnsupportedMediaType",
                    "strategic merge patch is not supported for custom resources",
                )
            patched = strategic_merge_patch(old, body)
        elif content_type == "application/merge-patch+json":
            patched = merge_patch(old, body)
        else:
            raise ApiFailure(
                415, "UnsupportedMediaType", f"the patch type {content_type!r} is not supported"
            )
        return 200, self._update(kind, key, patched, subresource, params, replace=False)

    def _apply(
        self, kind: Kind, key: ObjectKey, body: Any, subresource: str, params: dict[str, str]
    ) -> tuple[int, Json]:
        if not isinstance(body, dict):
            raise ApiFailure(400, "BadRequest", "the applied configuration is not an object")
        if kind.schema is None and (refused := kube_typed.refusal(body)):
            raise ApiFailure(500, "", refused)
        if key not in self.store:
            return 201, self._create(kind, key[1], body, {**params, "apply": "true"})
        old = self._existing(kind, key)
        manager = params["fieldManager"]
        if subresource == "status":
            patched = kube_apply.merge(old, {"status": body.get("status")})
        else:
            applied = {k: v for k, v in body.items() if not (kind.status and k == "status")}
            try:
                patched = kube_apply.apply(
                    old, applied, manager, force=params.get("force") == "true"
                )
            except kube_apply.ApplyConflict as conflict:
                texts = [f'conflict with "{who}": .{path}' for who, path in conflict.conflicts]
                count = len(texts)
                message = f"Apply failed with {count} conflict{'s' if count > 1 else ''}: "
                raise ApiFailure(409, "Conflict", message + "; ".join(texts)) from conflict
        return 200, self._update(kind, key, patched, subresource, params, replace=False,
                                 applied=True)  # fmt: skip

    def _scale(
        self, kind: Kind, key: ObjectKey, method: str, body: Any, params: dict[str, str]
    ) -> Json:
        """GET, PUT or merge-PATCH a parent's Scale; a write updates the parent's replicas."""
        old = self._existing(kind, key)
        if method == "GET":
            return kube_scale.scale_of(old)
        if method == "PUT":
            scale = body
        elif method == "PATCH":
            scale = merge_patch(kube_scale.scale_of(old), body)
        else:
            raise ApiFailure(405, "MethodNotAllowed", f"{method} is not supported on scale")
        replicas = kube_scale.replicas_of(scale)
        if replicas is None:
            message = f'Scale.autoscaling "{key[2]}" is invalid: spec.replicas: Invalid value'
            raise ApiFailure(422, "Invalid", message)
        parent = kube_scale.scaled(old, scale, replicas)
        updated = self._update(
            kind, key, parent, kube_scale.SUBRESOURCE, params, replace=method == "PUT"
        )
        return kube_scale.scale_of(updated)

    def _check_preconditions(self, kind: Kind, key: ObjectKey, wanted: dict[str, Any]) -> None:
        """A DeleteOptions' `preconditions` (uid, resourceVersion) against the stored object:
        a mismatch is 409 Conflict, as k8s.io/apiserver's storage Preconditions.Check."""
        metadata = self._existing(kind, key)["metadata"]
        for key_name, name in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
            if wanted.get(key_name) and wanted[key_name] != metadata.get(key_name):
                message = (
                    f'Operation cannot be fulfilled on {kind.qualified} "{key[2]}": Precondition '
                    f"failed: {name} in precondition: {wanted[key_name]}, {name} in object "
                    f"meta: {metadata.get(key_name)}"
                )
                raise ApiFailure(409, "Conflict", message)

    def _delete(self, kind: Kind, key: ObjectKey, params: dict[str, str]) -> Json:
        obj = self._existing(kind, key)
        if params.get("dryRun"):
            return obj
        metadata = obj["metadata"]
        orphaning = params.get("propagationPolicy") == "Orphan"
        if orphaning and not metadata.get("deletionTimestamp"):
            metadata["finalizers"] = [*(metadata.get("finalizers") or []), ORPHAN_FINALIZER]
        if metadata.get("finalizers"):
            if not metadata.get("deletionTimestamp"):
                metadata.update(deletionTimestamp=_now(), deletionGracePeriodSeconds=0)
                metadata["resourceVersion"] = str(next(self._revision))
                previous, self.store[key] = self.store[key], obj
                self._emit(kind, "MODIFIED", obj, previous)
                if orphaning:
                    self._garbage_collect(lambda: self._orphan(key))
            return copy.deepcopy(obj)
        metadata["resourceVersion"] = str(next(self._revision))
        self._remove(kind, key, obj)
        return obj

    def _orphan(self, key: ObjectKey) -> None:
        """What the garbage collector does for an owner with the `orphan` finalizer: each
        dependent loses its reference to the owner (a patch of its own) and stays; then the
        finalizer goes, and with the last one the owner."""
        owner = self.store.get(key)
        if owner is None or ORPHAN_FINALIZER not in (owner["metadata"].get("finalizers") or []):
            return
        uid = owner["metadata"]["uid"]
        params = {"fieldManager": GC_MANAGER}
        for (kind_key, namespace, name), obj in list(self.store.items()):
            references = obj["metadata"].get("ownerReferences") or []
            kept = [reference for reference in references if reference.get("uid") != uid]
            if len(kept) == len(references):
                continue
            orphan = copy.deepcopy(obj)
            if kept:
                orphan["metadata"]["ownerReferences"] = kept
            else:
                del orphan["metadata"]["ownerReferences"]
            dependent = (kind_key, namespace, name)
            self._update(self.kinds[kind_key], dependent, orphan, "", params, replace=False)
        released = copy.deepcopy(self.store[key])
        finalizers = [f for f in released["metadata"]["finalizers"] if f != ORPHAN_FINALIZER]
        if finalizers:
            released["metadata"]["finalizers"] = finalizers
        else:
            del released["metadata"]["finalizers"]
        self._update(self.kinds[key[0]], key, released, "", params, replace=False)

    def _remove(self, kind: Kind, key: ObjectKey, obj: Json) -> None:
        """Delete for good, then collect what it owned (and, for a CRD, its objects)."""
        self.store.pop(key, None)
        self._emit(kind, "DELETED", obj)
        uid = obj["metadata"]["uid"]
        if kind.key == CRD_KEY:
            for served in self._crd_kinds(obj):
                self._collect(lambda k, _o, gone=served.key: k == gone)
                self.kinds.pop(served.key, None)

        def dependent(_kind: KindKey, obj: Json) -> bool:
            return any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences", []))

        self._garbage_collect(lambda: self._collect(dependent))

    def _garbage_collect(self, work: Callable[[], None]) -> None:
        """The garbage collector's `work`, at once or `gc_delay_s` later: a real one works in
        the background, from its own watches."""
        if self.gc_delay_s > 0:
            asyncio.get_running_loop().call_later(self.gc_delay_s, work)
        else:
            work()

    def _collect_if_dangling(self, key: ObjectKey, obj: Json) -> None:
        """The garbage collector deletes a dependent none of whose owners exist, also one
        created, or given its references, after they went (a controller racing the owners'
        deletion); it looks again when it acts."""
        if not self._owners_gone(obj):
            return

        def collect() -> None:
            found = self.store.get(key)
            if found is not None and self._owners_gone(found):
                self._delete(self.kinds[key[0]], key, {})

        self._garbage_collect(collect)

    def _owners_gone(self, obj: Json) -> bool:
        references = obj["metadata"].get("ownerReferences") or []
        if not references:
            return False
        live = {stored["metadata"]["uid"] for stored in self.store.values()}
        return not any(reference.get("uid") in live for reference in references)

    def _collect(self, condemned: Callable[[KindKey, Json], bool]) -> None:
        for (kind_key, namespace, name), obj in list(self.store.items()):
            if (kind_key, namespace, name) in self.store and condemned(kind_key, obj):
                kind = self.kinds[kind_key]
                self._delete(kind, (kind_key, namespace, name), {})

    # ---- custom resource definitions --------------------------------------------------------

    @staticmethod
    def _crd_kinds(crd: Json) -> Iterable[Kind]:
        spec = crd.get("spec", {})
        names = spec.get("names", {})
        for version in spec.get("versions", []):
            if not version.get("served", True):
                continue
            yield Kind(
                group=spec.get("group", ""),
                version=version["name"],
                plural=names.get("plural", ""),
                kind=names.get("kind", ""),
                namespaced=spec.get("scope") == "Namespaced",
                status="status" in (version.get("subresources") or {}),
                short_names=tuple(names.get("shortNames", [])),
                categories=tuple(names.get("categories", [])),
                schema=(version.get("schema") or {}).get(
                    "openAPIV3Schema",
                    {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                ),
                columns=tuple(version.get("additionalPrinterColumns", [])),
            )

    def _establish(self, crd: Json) -> None:
        """Serve the CRD's kinds at once and say so in its status, as a real server soon does."""
        for kind in self._crd_kinds(crd):
            self.kinds[kind.key] = kind
        spec = crd.get("spec", {})
        conditions = [
            {
                "type": kind,
                "status": "True",
                "reason": reason,
                "message": message,
                "lastTransitionTime": _now(),
            }
            for kind, reason, message in (
                ("NamesAccepted", "NoConflicts", "no conflicts found"),
                ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
            )
        ]
        old_conditions = crd.get("status", {}).get("conditions")
        crd["status"] = {
            "acceptedNames": spec.get("names", {}),
            "storedVersions": [v["name"] for v in spec.get("versions", []) if v.get("storage")],
            "conditions": old_conditions or conditions,
        }


def _seen(event: Json, previous: Json | None, matches: Callable[[Json], bool]) -> Json | None:
    """The event as a watch that selects `matches` receives it, or None if it is not told.

    As the API server's watch cache (k8s.io/apiserver cacher, convertToWatchEvent): an object
    that starts to match is ADDED, one that stops matching DELETED, as it was before the
    write but at the write's resourceVersion.
    """
    obj = event["object"]
    if event["type"] == "DELETED":
        return copy.deepcopy(event) if matches(obj) else None
    before = previous is not None and matches(previous)
    if matches(obj):
        return {"type": "MODIFIED" if before else "ADDED", "object": copy.deepcopy(obj)}
    if previous is None or not before:
        return None
    gone = copy.deepcopy(previous)
    gone["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
    return {"type": "DELETED", "object": gone}


def _timeless(obj: Json) -> Json:
    """An object without its managedFields' timestamps, which alone make no change."""
    entries = obj.get("metadata", {}).get("managedFields") or []
    bare = [{k: v for k, v in entry.items() if k != "time"} for entry in entries]
    return {**obj, "metadata": {**obj.get("metadata", {}), "managedFields": bare}}


class ServedKubeApi:
    """A KubeApiServer on 127.0.0.1 and a free port, in a thread with its own event loop."""

    def __init__(self) -> None:
        self.api = KubeApiServer()
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="kube-api", daemon=True)
        self._error: BaseException | None = None

    def __enter__(self) -> ServedKubeApi:
        self._thread.start()
        if not self._ready.wait(timeout=30) or self._error is not None:
            raise RuntimeError(f"the test API server did not start: {self._error!r}")
        return self

    def __exit__(self, *_: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:  # reported to the thread that waits in __enter__
            self._error = error
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with self.api, kmock.Server(self.api) as server:
            self.url = f"http://{server.host}:{server.port}"
            self._ready.set()
            await self._stop.wait()

    def write_kubeconfig(
        self, path: Path, namespace: str = "default", token: str = "carpool-test"
    ) -> Path:
        """A kubeconfig for this server; `token` from `service_account_token` is RBAC-bound."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "carpool-test", "cluster": {"server": self.url}}],
            "users": [{"name": "carpool-test", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "carpool-test",
                    "context": {
                        "cluster": "carpool-test",
                        "user": "carpool-test",
                        "namespace": namespace,
                    },
                }
            ],
            "current-context": "carpool-test",
        }
        path.write_text(yaml.safe_dump(config))
        return path
