"""RBAC as the API server's authorizer evaluates it, for the test API server.

A request is described by its attributes (user, verb, API group, resource, subresource,
namespace, name), as the API server's request-info resolver reads them off the URL and method;
`allowed` grants it when a rule of a role bound to the user covers it (ClusterRoleBindings
everywhere, RoleBindings in their own namespace), and `forbidden_message` words the denial as
the API server does. Pure: the roles and bindings are passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

Json = dict[str, Any]
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


@dataclass(frozen=True)
class Attributes:
    user: str
    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""


def verb(method: str, named: bool, params: dict[str, str]) -> str:
    """The verb a resource request is authorized as (a server-side apply: patch)."""
    if method == "GET":
        if params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if named else "list"
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def listed_name(params: dict[str, str]) -> str:
    """A list or watch of one object names it by field selector; RBAC's resourceNames see it."""
    for piece in params.get("fieldSelector", "").split(","):
        key, _, value = piece.replace("==", "=").partition("=")
        if key.strip() == "metadata.name":
            return value.strip()
    return ""


def groups(user: str) -> set[str]:
    """The groups the API server puts an authenticated service account in."""
    found = {"system:authenticated"}
    if user.startswith(SERVICE_ACCOUNT_PREFIX):
        namespace = user.removeprefix(SERVICE_ACCOUNT_PREFIX).split(":")[0]
        found |= {"system:serviceaccounts", f"system:serviceaccounts:{namespace}"}
    return found


def _binds(binding: Json, user: str) -> bool:
    for subject in binding.get("subjects") or []:
        kind, name = subject.get("kind"), subject.get("name", "")
        if kind == "User" and name == user:
            return True
        if kind == "Group" and name in groups(user):
            return True
        if kind == "ServiceAccount":
            namespace = subject.get("namespace") or binding["metadata"].get("namespace", "")
            if user == f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}":
                return True
    return False


def _covers(rule: Json, request: Attributes) -> bool:
    resource = request.resource
    if request.subresource:
        resource = f"{resource}/{request.subresource}"
    resources = set(rule.get("resources") or [])
    names = rule.get("resourceNames") or []
    return (
        bool({request.group, "*"} & set(rule.get("apiGroups") or []))
        and bool({request.verb, "*"} & set(rule.get("verbs") or []))
        and (
            bool({resource, "*"} & resources)
            or (bool(request.subresource) and f"*/{request.subresource}" in resources)
        )
        and (not names or request.name in names)
    )


def allowed(
    request: Attributes,
    roles: dict[tuple[str, str], Json],
    bindings: Iterable[Json],
) -> bool:
    """Whether a binding of `request.user` grants the request.

    `roles`: by (namespace, name), ClusterRoles under namespace "". `bindings`: every
    ClusterRoleBinding and RoleBinding.
    """
    for binding in bindings:
        scope = binding["metadata"].get("namespace", "")
        if scope and scope != request.namespace:
            continue  # a RoleBinding grants in its own namespace only
        if not _binds(binding, request.user):
            continue
        reference = binding.get("roleRef") or {}
        role_scope = scope if reference.get("kind") == "Role" else ""
        role = roles.get((role_scope, reference.get("name", "")))
        if role is not None and any(_covers(rule, request) for rule in role.get("rules") or []):
            return True
    return False


def forbidden_message(request: Attributes) -> str:
    """The API server's words for a denied request."""
    qualified = f"{request.resource}.{request.group}" if request.group else request.resource
    subject = f'{qualified} "{request.name}"' if request.name else qualified
    resource = request.resource
    if request.subresource:
        resource = f"{resource}/{request.subresource}"
    where = (
        f'in the namespace "{request.namespace}"' if request.namespace else "at the cluster scope"
    )
    return (
        f'{subject} is forbidden: User "{request.user}" cannot {request.verb} resource '
        f'"{resource}" in API group "{request.group}" {where}'
    )


def binding(role_kind: str, role: str, namespace: str, account: str) -> Json:
    """A binding of the Role or ClusterRole `role` to the ServiceAccount namespace/account
    (POST it as a RoleBinding or a ClusterRoleBinding, under the role's name)."""
    return {
        "metadata": {"name": role},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
